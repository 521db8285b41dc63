#!/usr/bin/env bash
# Cilium as the kind cluster's CNI, so NetworkPolicy is enforced there the way it is on a user's
# cluster: the agent and operator built from the Go module proxy (hack/build-tools.sh cilium,
# version in hack/versions.env), in an image on gymkube's cilium base, installed with Cilium's own
# Helm chart from the same module version.
#
#   hack/cilium.sh install     # built (cached), loaded, installed, Ready; pods that predate it restarted
#   hack/cilium.sh uninstall   # the chart removed (pods keep the addresses Cilium gave them until
#                              # they restart; `make kind-down` for a clean cluster)
#   hack/cilium.sh image       # only the image
#   hack/cilium.sh status      # exit 0 when Cilium runs in the kind cluster
#
# kind only: Cilium takes over the node's network (eBPF programs, routes, iptables), which on the
# local cluster (hack/local-cluster.sh) is this machine's own.
#
# What differs from the chart's defaults, and why: privileged (this host's capability bounding set
# lacks CAP_SYS_RESOURCE, which the chart's capability list asks for); the CNI plugin goes where
# the node's containerd looks (/usr/lib/cni); one operator replica (one node); no Hubble, no L7
# proxy (Envoy is not built), no health-check endpoints; small CPU requests (2 cores in all).
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"
cd "$HACK_DIR/.."

IMAGE=gymkube/e2e-cilium:$CILIUM_VERSION
NAMESPACE=kube-system
RELEASE=cilium
READY_TIMEOUT=300s
# What hack/build-tools.sh cilium builds (CILIUM_BINARIES in hack/lib/tools.sh); the CNI plugin
# goes to /opt/cni/bin, the rest to /usr/bin.
BINARIES=("${CILIUM_BINARIES[@]#*:}")

say() { printf 'cilium: %s\n' "$*" >&2; }

tools=$(hack/tool-path.sh)
kubectl() { "$tools/kubectl" --kubeconfig "$KIND_KUBECONFIG" "$@"; }
helm() { "$tools/helm" --kubeconfig "$KIND_KUBECONFIG" "$@"; }

module_dir() { go_module_dir "github.com/cilium/cilium@$CILIUM_VERSION"; }

# Builds IMAGE unless Docker has it from the same recipe.
image() {
	local recipe context module base
	hack/build-tools.sh cilium
	hack/base-image.sh cilium
	base=$(docker image inspect --format '{{.Id}}' gymkube/base-cilium:bookworm)
	recipe=$(cat hack/cilium/Dockerfile <(echo "$CILIUM_VERSION $base") <(declare -f image) \
		<(cd "$tools" && sha256sum "${BINARIES[@]}") | sha256sum | cut -c1-16)
	if [[ $(docker image inspect --format '{{index .Config.Labels "gymkube.recipe"}}' "$IMAGE" 2>/dev/null) == "$recipe" ]]; then
		return
	fi
	module=$(module_dir)
	context=$(mktemp -d)
	mkdir "$context/bin"
	for bin in "${BINARIES[@]}"; do
		[[ $bin == cilium-cni ]] || cp "$tools/$bin" "$context/bin/"
	done
	cp "$tools/cilium-cni" "$context/"
	cp -r "$module/bpf" "$context/bpf"
	cp "$module/images/cilium/init-container.sh" "$module/plugins/cilium-cni/install-plugin.sh" \
		"$module/plugins/cilium-cni/cni-uninstall.sh" "$context/"
	cp hack/cilium/Dockerfile "$context/"
	chmod -R u+w "$context"
	# Module zips keep no file modes.
	chmod 0755 "$context"/*.sh
	say "building $IMAGE"
	docker build -q --label "gymkube.recipe=$recipe" -t "$IMAGE" "$context" >/dev/null
	rm -rf "$context"
}

values() {
	cat <<EOF
image: {override: "$IMAGE", pullPolicy: IfNotPresent}
operator:
  image: {override: "$IMAGE", pullPolicy: IfNotPresent}
  replicas: 1
  resources: {requests: {cpu: 10m, memory: 64Mi}}
resources: {requests: {cpu: 50m, memory: 256Mi}}
securityContext: {privileged: true}
cni: {binPath: /usr/lib/cni, exclusive: true}
ipam: {mode: kubernetes}
kubeProxyReplacement: "false"
l7Proxy: false
hubble: {enabled: false}
envoy: {enabled: false}
healthChecking: false
endpointHealthChecking: {enabled: false}
EOF
}

status() {
	kind_cluster_exists && kubectl -n "$NAMESPACE" get daemonset cilium >/dev/null 2>&1
}

# Pods started before Cilium have their addresses from the node image's own CNI config; Cilium
# neither knows nor polices them. Restarted, they come back on Cilium (its docs do the same).
restart_unmanaged_pods() {
	local managed pods ns name
	managed=$(kubectl get ciliumendpoints -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}')
	pods=$(kubectl get pods -A --field-selector status.phase=Running \
		-o jsonpath='{range .items[?(@.spec.hostNetwork!=true)]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}')
	while read -r pod; do
		[[ -n $pod ]] || continue
		grep -qxF "$pod" <<<"$managed" && continue
		ns=${pod%/*}
		name=${pod#*/}
		say "restarting $pod (it predates Cilium)"
		kubectl -n "$ns" delete pod "$name" --wait=false >/dev/null
	done <<<"$pods"
}

install() {
	kind_cluster_exists || { say "error: the kind cluster is not up (make kind-up)"; exit 2; }
	local start=$SECONDS chart
	image
	hack/kind-up.sh "$IMAGE" >/dev/null
	chart=$(module_dir)/install/kubernetes/cilium
	values | helm upgrade --install "$RELEASE" "$chart" --namespace "$NAMESPACE" --values - >/dev/null
	kubectl -n "$NAMESPACE" rollout status daemonset/cilium --timeout "$READY_TIMEOUT" >&2
	kubectl -n "$NAMESPACE" rollout status deployment/cilium-operator --timeout "$READY_TIMEOUT" >&2
	restart_unmanaged_pods
	say "Cilium $CILIUM_VERSION is Ready after $((SECONDS - start)) s"
}

uninstall() {
	kind_cluster_exists || return 0
	helm uninstall "$RELEASE" --namespace "$NAMESPACE" --ignore-not-found >/dev/null
	say "Cilium removed"
}

case ${1:-} in
install) install ;;
uninstall) uninstall ;;
image) image ;;
status) status ;;
*)
	echo "usage: $0 install|uninstall|image|status" >&2
	exit 2
	;;
esac
