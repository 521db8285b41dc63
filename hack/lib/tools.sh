# Shared by hack/build-tools.sh and hack/tool-path.sh: the pins and where their binaries live.
# GYMKUBE_CACHE (default ~/.cache/gymkube) holds wrapper modules and binaries; GYMKUBE_BIN_DIR overrides
# the binary directory outright (for tools built elsewhere).
# shellcheck shell=bash
GYMKUBE_HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../versions.env
source "$GYMKUBE_HACK_DIR/versions.env"
GYMKUBE_CACHE=${GYMKUBE_CACHE:-$HOME/.cache/gymkube}
GYMKUBE_BIN_DIR=${GYMKUBE_BIN_DIR:-$GYMKUBE_CACHE/bin/$KUBERNETES_VERSION}
