#!/usr/bin/env bash
# Deletes the kind cluster hack/kind-up.sh created, and its kubeconfig.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"

kind=$(kind_bin)
if "$kind" get clusters 2>/dev/null | grep -xF "$KIND_NAME" >/dev/null; then
	"$kind" delete cluster --name "$KIND_NAME" --kubeconfig "$KIND_KUBECONFIG"
fi
rm -f "$KIND_KUBECONFIG"
