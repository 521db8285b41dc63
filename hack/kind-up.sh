#!/usr/bin/env bash
# Creates (or reuses) a kind cluster named gymkube and loads images into it. This is the path for
# machines with Docker and a reachable registry (users' CI); kind's node image is pulled from
# Docker Hub, so on machines without a registry use hack/local-cluster.sh instead.
#
#   hack/kind-up.sh [IMAGE...]     # prints the kubeconfig path
#
# KIND_NODE_IMAGE overrides the node image; GYMKUBE_KIND_NAME the cluster name.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"

"$HACK_DIR/ensure-docker.sh"
kind=$(kind_bin)
if "$kind" get clusters 2>/dev/null | grep -xF "$KIND_NAME" >/dev/null; then
	log "reusing kind cluster $KIND_NAME"
	"$kind" export kubeconfig --name "$KIND_NAME" --kubeconfig "$KIND_KUBECONFIG" >/dev/null
else
	log "creating kind cluster $KIND_NAME from $KIND_NODE_IMAGE"
	"$kind" create cluster --name "$KIND_NAME" --image "$KIND_NODE_IMAGE" \
		--kubeconfig "$KIND_KUBECONFIG" --wait 180s ||
		die "kind could not create the cluster; if the node image could not be pulled (no registry), use \`make cluster-up\`"
fi
for image in "$@"; do
	log "loading $image"
	"$kind" load docker-image "$image" --name "$KIND_NAME" >/dev/null
done
log "export KUBECONFIG=$KIND_KUBECONFIG"
echo "$KIND_KUBECONFIG"
