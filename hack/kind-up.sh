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
	out=$(mktemp)
	trap 'rm -f "$config" "$out"' EXIT
	kind_cluster_config "$image" >"$config"
	# kind gives the node's systemd a fixed 30 s to boot; on a loaded machine it can take longer,
	# and kind then deletes the node. Boot failures are retried; any other failure is not.
	for attempt in 1 2 3; do
		if "$kind" create cluster --name "$KIND_NAME" --image "$image" --config "$config" \
			--kubeconfig "$KIND_KUBECONFIG" --wait 180s 2>&1 | tee "$out" >&2; then
			break
		fi
		if ((attempt == 3)) || ! grep -q 'could not find a log line that matches' "$out"; then
			die "kind could not create the cluster from $image (\`docker logs $KIND_NAME-control-plane\` shows the node's boot)"
		fi
		log "the node did not boot within kind's 30 s (load $(cut -d' ' -f1 /proc/loadavg)); retrying"
	done
fi
if (($#)); then
	# What `kind load docker-image` does, streamed: kind writes the whole archive to a temporary
	# file first, gigabytes for the trainer image, on top of the two copies the node keeps.
	# Images the node has (same ID) are skipped; the rest go as one archive, so layers they share
	# are copied once.
	node=$KIND_NAME-control-plane
	missing=()
	for ref in "$@"; do
		want=$(docker image inspect --format '{{.Id}}' "$ref") || die "Docker has no image $ref"
		have=$(docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' \
			"$ref" 2>/dev/null || true)
		[[ $have == "$want" ]] || missing+=("$ref")
	done
	if ((${#missing[@]})); then
		log "loading ${missing[*]}"
		docker save "${missing[@]}" |
			docker exec -i "$node" ctr --namespace=k8s.io images import --all-platforms --digests - >/dev/null ||
			die "loading ${missing[*]} into $node failed (see above; \`df -h\` if the disk is full)"
	else
		log "the node has $* already"
	fi
fi
log "export KUBECONFIG=$KIND_KUBECONFIG"
echo "$KIND_KUBECONFIG"
