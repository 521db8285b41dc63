#!/usr/bin/env bash
# Prints the directory holding the pinned tools (kubectl, etcd, helm, ...) built by hack/build-tools.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/tools.sh"
echo "$GYMKUBE_BIN_DIR"
