#!/usr/bin/env bash
# Deletes the kind cluster hack/kind-up.sh created, and its kubeconfig.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"

if kind_cluster_exists; then
	"$(kind_bin)" delete cluster --name "$KIND_NAME" --kubeconfig "$KIND_KUBECONFIG"
fi
rm -f "$KIND_KUBECONFIG"
