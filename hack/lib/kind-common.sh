# shellcheck shell=bash
# Shared by hack/kind-up.sh, hack/kind-down.sh and hack/kind-node-image.sh.
# shellcheck source=cluster-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster-common.sh"
# shellcheck source=cluster-gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster-gobuild.sh"

KIND_VERSION=v0.30.0
# kind $KIND_VERSION's own default node image (Kubernetes 1.34, the minor gymkube pins), by digest.
KIND_UPSTREAM_NODE_IMAGE=kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a
# The node image hack/kind-node-image.sh builds here, where kindest/node cannot be pulled.
KIND_LOCAL_NODE_IMAGE=${GYMKUBE_KIND_LOCAL_NODE_IMAGE:-gymkube/kind-node:$KUBERNETES_VERSION}
# kind's default pod subnet; the local node image's CNI config hands out addresses from it.
KIND_POD_SUBNET=10.244.0.0/16
# Tags of the etcd and CoreDNS images in the local node image (the project's pinned builds), which
# kind's kubeadm config must name instead of kubeadm's defaults.
KIND_ETCD_IMAGE_TAG=${ETCD_VERSION#v}-0
KIND_COREDNS_IMAGE_TAG=$COREDNS_VERSION
# The tools the node image holds (hack/build-tools.sh builds them).
KIND_NODE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl kubeadm etcd)
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

kind_cluster_exists() {
	"$(kind_bin)" get clusters 2>/dev/null | grep -xF "$KIND_NAME" >/dev/null
}

# Any HTTP answer from Docker Hub's registry means Docker can pull kind's own node image.
registry_answers() { curl -s -m 5 -o /dev/null https://registry-1.docker.io/v2/; }

# The node image a new cluster starts from: $KIND_NODE_IMAGE when set; else kind's own image when
# Docker has it or can pull it (a laptop, a GitHub runner); else the one hack/kind-node-image.sh
# built. Fails when there is none.
kind_node_image() {
	if [[ -n ${KIND_NODE_IMAGE:-} ]]; then
		echo "$KIND_NODE_IMAGE"
	elif docker image inspect "$KIND_UPSTREAM_NODE_IMAGE" >/dev/null 2>&1 || registry_answers; then
		echo "$KIND_UPSTREAM_NODE_IMAGE"
	elif docker image inspect "$KIND_LOCAL_NODE_IMAGE" >/dev/null 2>&1; then
		echo "$KIND_LOCAL_NODE_IMAGE"
	else
		return 1
	fi
}

# kind's cluster config for IMAGE. The local node image carries no kindnetd (its own CNI config
# serves KIND_POD_SUBNET, kind's default) and the project's etcd and CoreDNS builds under their
# own tags, which kubeadm must be told; kind's own image needs nothing.
kind_cluster_config() {
	echo "kind: Cluster"
	echo "apiVersion: kind.x-k8s.io/v1alpha4"
	# Registry hosts from /etc/containerd/certs.d, where hack/registry.sh points localhost:5001
	# at the e2e suite's registry.
	cat <<'CONFIG'
containerdConfigPatches:
- |-
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
CONFIG
	[[ $1 == "$KIND_LOCAL_NODE_IMAGE" ]] || return 0
	cat <<CONFIG
networking:
  disableDefaultCNI: true
  podSubnet: "$KIND_POD_SUBNET"
kubeadmConfigPatches:
- |
  kind: ClusterConfiguration
  etcd:
    local:
      imageTag: "$KIND_ETCD_IMAGE_TAG"
  dns:
    imageTag: "$KIND_COREDNS_IMAGE_TAG"
CONFIG
}
