# Shared by hack/build-tools.sh and hack/tool-path.sh: the pins and where their binaries live.
# GYMKUBE_CACHE (default ~/.cache/gymkube) holds wrapper modules and binaries; GYMKUBE_BIN_DIR overrides
# the binary directory outright (for tools built elsewhere).
# shellcheck shell=bash
GYMKUBE_HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../versions.env
source "$GYMKUBE_HACK_DIR/versions.env"
GYMKUBE_CACHE=${GYMKUBE_CACHE:-$HOME/.cache/gymkube}
GYMKUBE_BIN_DIR=${GYMKUBE_BIN_DIR:-$GYMKUBE_CACHE/bin/$KUBERNETES_VERSION}
# Cilium's binaries (package:binary), which hack/build-tools.sh cilium builds and hack/cilium.sh
# puts in its image: what its agent pod and operator pod run.
CILIUM_BINARIES=(daemon:cilium-agent operator:cilium-operator-generic plugins/cilium-cni:cilium-cni
	cilium-dbg:cilium-dbg tools/mount:cilium-mount tools/sysctlfix:cilium-sysctlfix)

# The directory of Go module PATH@VERSION in the module cache, downloaded when missing (from
# $GYMKUBE_CACHE/src, outside any checkout's go.mod).
go_module_dir() {
	mkdir -p "$GYMKUBE_CACHE/src"
	(cd "$GYMKUBE_CACHE/src" && go mod download -json "$1") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}
