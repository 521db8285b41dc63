#!/usr/bin/env bash
# Creates (or reuses) a one-node kind cluster named gymkube and loads images into it.
#
#   hack/kind-up.sh [IMAGE...]     # prints the kubeconfig path
#
# The node image is kind's own kindest/node (pinned by digest) wherever Docker has it or can pull
# it, else gymkube's own (`make kind-node-image`, built here without a registry); KIND_NODE_IMAGE
# overrides the choice. GYMKUBE_KIND_NAME names the cluster, GYMKUBE_KIND_KUBECONFIG its kubeconfig.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"

"$HACK_DIR/ensure-docker.sh"
kind=$(kind_bin)
if kind_cluster_exists; then
	log "reusing kind cluster $KIND_NAME"
	"$kind" export kubeconfig --name "$KIND_NAME" --kubeconfig "$KIND_KUBECONFIG" >/dev/null 2>&1
else
	image=$(kind_node_image) ||
		die "no node image: kindest/node cannot be pulled here (no registry); build one with \`make kind-node-image\`"
	log "creating kind cluster $KIND_NAME from $image"
	config=$(mktemp)
	trap 'rm -f "$config"' EXIT
	kind_cluster_config "$image" >"$config"
	"$kind" create cluster --name "$KIND_NAME" --image "$image" --config "$config" \
		--kubeconfig "$KIND_KUBECONFIG" --wait 180s ||
		die "kind could not create the cluster from $image (\`docker logs $KIND_NAME-control-plane\` shows the node's boot)"
fi
if (($#)); then
	# One call: kind skips images the node already has and saves the rest as one archive, so
	# layers the images share are copied once.
	log "loading $*"
	"$kind" load docker-image "$@" --name "$KIND_NAME" >/dev/null
fi
log "export KUBECONFIG=$KIND_KUBECONFIG"
echo "$KIND_KUBECONFIG"
