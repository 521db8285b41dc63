#!/usr/bin/env bash
# The GPU cluster's own controllers, for real: KubeRay's operator and Kueue, built from the Go module
# proxy (hack/build-tools.sh kuberay kueue, versions in hack/versions.env), each in an image on
# gymkube's base, installed into the kind cluster with the CRDs and manifests of the same module
# versions (their config/ trees, rendered by kustomize), as a user's GPU cluster would have them.
#
#   hack/controllers.sh install [kind|local]     # built (cached), loaded, applied, Available
#   hack/controllers.sh uninstall [kind|local]   # both removed, their CRDs too
#   hack/controllers.sh images                   # only the two images
#
# The cluster is kind's (hack/kind-up.sh, the default) or the local one (hack/local-cluster.sh).
#
# What changes from upstream: the image (ours, IfNotPresent, since no registry serves it), KubeRay's
# namespace (kuberay-system, not default), the CPU both request (50m, not 100m and 500m: the
# e2e node has 2 cores, and what they reserve no trainer can have; they use far less), and Kueue's
# visibility APIService left out (below). Nothing else.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"
cd "$HACK_DIR/.."

KUBERAY_IMAGE=gymkube/e2e-kuberay:$KUBERAY_VERSION
KUEUE_IMAGE=gymkube/e2e-kueue:$KUEUE_VERSION
KUBERAY_NAMESPACE=kuberay-system
KUEUE_NAMESPACE=kueue-system
AVAILABLE_TIMEOUT=300s
CONTROLLER_CPU_REQUEST=50m
# Kueue's on-demand visibility API (a LocalQueue's pending Workloads in order) is not registered:
# in kind here the API server's availability check of it answered 404, where the same request by
# hand answered 200, and an aggregated API that fails discovery stops every namespace deletion
# in the cluster (NamespaceDeletionDiscoveryFailure). A queued run then shows no position.
KUEUE_VISIBILITY_VERSIONS="v1beta1 v1beta2"

say() { printf 'controllers: %s\n' "$*" >&2; }

CLUSTER=${2:-kind}
case $CLUSTER in
kind) KUBECONFIG_PATH=$KIND_KUBECONFIG ;;
local) KUBECONFIG_PATH=$(hack/local-cluster.sh kubeconfig) ;;
*)
	say "error: cluster '$CLUSTER' (kind or local)"
	exit 2
	;;
esac

kubectl() { "$(hack/tool-path.sh)/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

cluster_up() {
	if [[ $CLUSTER == kind ]]; then kind_cluster_exists; else hack/local-cluster.sh status >/dev/null 2>&1; fi
}

load_images() {
	if [[ $CLUSTER == kind ]]; then
		hack/kind-up.sh "$@" >/dev/null
	else
		hack/local-cluster.sh load-image "$@"
	fi
}

# Builds IMAGE around TOOL's binary unless Docker has it from the same recipe.
build_image() {
	local tool=$1 image=$2 recipe context version_var=${1^^}_VERSION
	recipe=$(cat hack/controllers/Dockerfile <(echo "$tool ${!version_var}") | sha256sum | cut -c1-16)
	if [[ $(docker image inspect --format '{{index .Config.Labels "gymkube.recipe"}}' "$image" 2>/dev/null) == "$recipe" ]]; then
		return
	fi
	context=$(mktemp -d)
	cp hack/controllers/Dockerfile "$context/"
	cp "$(hack/tool-path.sh)/$tool" "$context/manager"
	say "building $image"
	docker build -q --label "gymkube.recipe=$recipe" -t "$image" "$context" >/dev/null
	rm -rf "$context"
}

images() {
	hack/build-tools.sh kuberay kueue
	build_image kuberay "$KUBERAY_IMAGE"
	build_image kueue "$KUEUE_IMAGE"
}

# kustomize overlays on the modules' config/ trees (named by relative paths: kustomize refuses
# absolute ones), rendered into one stream of manifests.
render() {
	local kuberay kueue overlay kustomize
	kuberay=$(go_module_dir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")
	kueue=$(go_module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")
	[[ -d $kuberay/config && -d $kueue/config ]] || { say "error: the controllers' modules have no config/"; exit 1; }
	kustomize=$(hack/tool-path.sh)/kustomize
	overlay=$(mktemp -d)
	mkdir -p "$overlay/kuberay" "$overlay/kueue"
	cat >"$overlay/kuberay/namespace.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $KUBERAY_NAMESPACE
EOF
	cat >"$overlay/kuberay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $KUBERAY_NAMESPACE
resources:
- namespace.yaml
- $(realpath --relative-to "$overlay/kuberay" "$kuberay/config/default")
images:
- name: quay.io/kuberay/operator
  newName: ${KUBERAY_IMAGE%:*}
  newTag: ${KUBERAY_IMAGE##*:}
patches:
- target: {kind: Deployment, name: kuberay-operator}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/resources/requests/cpu
      value: $CONTROLLER_CPU_REQUEST
EOF
	cat >"$overlay/kueue/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to "$overlay/kueue" "$kueue/config/default")
images:
- name: us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue
  newName: ${KUEUE_IMAGE%:*}
  newTag: ${KUEUE_IMAGE##*:}
patches:
- target: {kind: Deployment, name: kueue-controller-manager}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: IfNotPresent
    - op: replace
      path: /spec/template/spec/containers/0/resources/requests/cpu
      value: $CONTROLLER_CPU_REQUEST
EOF
	for version in $KUEUE_VISIBILITY_VERSIONS; do
		cat >>"$overlay/kueue/kustomization.yaml" <<EOF
- patch: |-
    \$patch: delete
    apiVersion: apiregistration.k8s.io/v1
    kind: APIService
    metadata:
      name: $version.visibility.kueue.x-k8s.io
EOF
	done
	"$kustomize" build "$overlay/kuberay"
	echo "---"
	"$kustomize" build "$overlay/kueue"
	rm -rf "$overlay"
}

install() {
	cluster_up || { say "error: the $CLUSTER cluster is not up (make kind-up, or hack/local-cluster.sh up)"; exit 2; }
	local start=$SECONDS
	images
	load_images "$KUBERAY_IMAGE" "$KUEUE_IMAGE"
	# Server-side: the RayJob and RayCluster CRDs outgrow the client-side apply annotation.
	render | kubectl apply --server-side --force-conflicts -f - >/dev/null
	for version in $KUEUE_VISIBILITY_VERSIONS; do
		kubectl delete apiservice "$version.visibility.kueue.x-k8s.io" --ignore-not-found >/dev/null
	done
	kubectl -n "$KUBERAY_NAMESPACE" rollout status deployment/kuberay-operator --timeout "$AVAILABLE_TIMEOUT" >&2
	kubectl -n "$KUEUE_NAMESPACE" rollout status deployment/kueue-controller-manager --timeout "$AVAILABLE_TIMEOUT" >&2
	say "KubeRay $KUBERAY_VERSION ($KUBERAY_NAMESPACE) and Kueue $KUEUE_VERSION ($KUEUE_NAMESPACE) are Available after $((SECONDS - start)) s"
}

uninstall() {
	cluster_up || return 0
	render | kubectl delete --ignore-not-found --wait=false -f - >/dev/null
	say "KubeRay and Kueue removed"
}

case ${1:-} in
install) install ;;
uninstall) uninstall ;;
images) images ;;
*)
	echo "usage: $0 install|uninstall|images" >&2
	exit 2
	;;
esac
