# shellcheck shell=bash
# Shared by hack/kind-up.sh and hack/kind-down.sh.
# shellcheck source=tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
# shellcheck source=cluster-gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster-gobuild.sh"

KIND_VERSION=v0.30.0
# kind $KIND_VERSION's own default node image (Kubernetes 1.34, the minor gymkube pins), by digest.
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a}
KIND_NAME=${GYMKUBE_KIND_NAME:-gymkube}
KIND_KUBECONFIG=${GYMKUBE_KIND_KUBECONFIG:-$GYMKUBE_CACHE/kind/kubeconfig}

log() { printf 'kind: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

kind_bin() {
	mkdir -p "$(dirname "$KIND_KUBECONFIG")"
	command -v go >/dev/null || die "Go is required to build kind (https://go.dev/doc/install)"
	gobuild_tool kind sigs.k8s.io/kind "$KIND_VERSION" sigs.k8s.io/kind
}
