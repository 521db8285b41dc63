#!/usr/bin/env bash
# The e2e suite's registry: the CNCF distribution registry (built by hack/build-tools.sh, in an
# image on gymkube's base), as a Docker container beside the cluster, so the node's kubelet pulls
# gymkube's images the way a user's cluster does. CLUSTER is kind (default) or local
# (hack/local-cluster.sh).
#
#   hack/registry.sh up [CLUSTER]    # the registry running, the node's containerd told where it is
#   hack/registry.sh push [CLUSTER]  # the images pushed (make push REGISTRY=localhost:5001)
#   hack/registry.sh down            # the registry container removed
#   hack/registry.sh address         # localhost:5001
#
# Both Docker here and the node name it localhost:5001 (Docker publishes it on 127.0.0.1; a kind
# node's containerd maps it to http://gymkube-registry:5000 on the kind network, the local
# cluster's containerd, a process on this host, reaches it where it is), so one image name works
# for the push and for the pull. Plain HTTP: Docker allows it for localhost.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"
cd "$HACK_DIR/.."

REGISTRY=localhost:5001
CONTAINER=gymkube-registry
IMAGE=gymkube/e2e-registry:$DISTRIBUTION_VERSION
NODE=$KIND_NAME-control-plane
CLUSTER=${2:-kind}
# What `docker push` sends (compressed, so the node downloads it for real): the images of the
# operator and of a pool. The others are pushed from the node's own store instead, as they are
# (gzip of the CPU trainer's 7 GB would take many minutes on 2 cores), so their pull fetches
# only the manifests.
DOCKER_PUSHED=(operator envserver router)
NODE_PUSHED=(preflight trainer-cpu)

# Where the node's containerd runs, how it names the registry, and where it reads registry hosts.
case $CLUSTER in
kind)
	node_sh() { docker exec -i "$NODE" sh -c "$1"; }
	NODE_CTR="ctr -n k8s.io"
	NODE_SERVER=http://$CONTAINER:5000
	HOSTS_DIR=/etc/containerd/certs.d
	NETWORK=(--network kind)
	;;
local)
	node_sh() { sh -c "$1"; }
	NODE_CTR="ctr --address $CONTAINERD_SOCK -n k8s.io"
	NODE_SERVER=http://$REGISTRY
	HOSTS_DIR=$REGISTRY_HOSTS_DIR
	NETWORK=()
	;;
*)
	echo "registry: error: CLUSTER=$CLUSTER (kind or local)" >&2
	exit 2
	;;
esac

say() { printf 'registry: %s\n' "$*" >&2; }

build_image() {
	local recipe context
	recipe=$(cat hack/registry/Dockerfile hack/registry/config.yml <(echo "$DISTRIBUTION_VERSION") | sha256sum | cut -c1-16)
	if [[ $(docker image inspect --format '{{index .Config.Labels "gymkube.recipe"}}' "$IMAGE" 2>/dev/null) == "$recipe" ]]; then
		return
	fi
	hack/build-tools.sh registry
	context=$(mktemp -d)
	cp hack/registry/Dockerfile hack/registry/config.yml "$context/"
	cp "$(hack/tool-path.sh)/registry" "$context/registry"
	say "building $IMAGE"
	docker build -q --label "gymkube.recipe=$recipe" -t "$IMAGE" "$context" >/dev/null
	rm -rf "$context"
}

node_hosts() {
	# containerd reads certs.d at each pull: no restart.
	node_sh "mkdir -p $HOSTS_DIR/$REGISTRY && cat >$HOSTS_DIR/$REGISTRY/hosts.toml" <<HOSTS
server = "$NODE_SERVER"
[host."$NODE_SERVER"]
  capabilities = ["pull", "resolve", "push"]
HOSTS
}

cluster_up() {
	case $CLUSTER in
	kind) kind_cluster_exists ;;
	local) hack/local-cluster.sh status >/dev/null 2>&1 ;;
	esac
}

up() {
	cluster_up || { say "error: no $CLUSTER cluster is up (make up, or hack/test-e2e.sh prepare)"; exit 2; }
	build_image
	if [[ $(docker inspect --format '{{.State.Running}}' "$CONTAINER" 2>/dev/null) != true ]]; then
		docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
		docker run -d --name "$CONTAINER" "${NETWORK[@]}" -p "127.0.0.1:${REGISTRY#*:}:5000" \
			--restart unless-stopped "$IMAGE" >/dev/null
	fi
	for _ in $(seq 50); do
		curl -fsS -o /dev/null "http://$REGISTRY/v2/" && break
		sleep 0.2
	done
	curl -fsS -o /dev/null "http://$REGISTRY/v2/" || { say "error: $CONTAINER does not answer on $REGISTRY"; exit 1; }
	node_hosts
	say "up: $REGISTRY (container $CONTAINER, for the $CLUSTER cluster)"
}

# A node that pulled from the registry in an earlier run (a kind cluster kept up between runs)
# still holds those images under the same names: the kubelet (IfNotPresent) would start them, an
# older build, and pull nothing. Forgotten before each push, so the suite pulls what it pushed.
forget_pulled() {
	node_sh "$NODE_CTR images ls -q | grep '^$REGISTRY/' | xargs -r $NODE_CTR images rm >/dev/null" ||
		{ say "error: removing the images the $CLUSTER node pulled from $REGISTRY earlier failed"; exit 1; }
}

push() {
	local start=$SECONDS tag name ref
	forget_pulled
	.venv/bin/python -m gymkube_dev.push "$REGISTRY" "${DOCKER_PUSHED[@]}" >&2
	tag=$(.venv/bin/python -m gymkube_dev.images tag)
	for name in "${NODE_PUSHED[@]}"; do
		ref=$REGISTRY/gymkube/$name:$tag
		# Tagged only for the push, then untagged: the kubelet must not find it under that name.
		node_sh "$NODE_CTR images tag --force docker.io/gymkube/$name:$tag $ref >/dev/null &&
			$NODE_CTR images push --hosts-dir $HOSTS_DIR $ref docker.io/gymkube/$name:$tag >/dev/null;
			rc=\$?; $NODE_CTR images rm $ref >/dev/null; exit \$rc" ||
			{ say "error: pushing $ref from the $CLUSTER node's image store failed"; exit 1; }
	done
	say "pushed ${DOCKER_PUSHED[*]} ${NODE_PUSHED[*]} in $((SECONDS - start)) s"
}

down() { docker rm -f "$CONTAINER" >/dev/null 2>&1 || true; }

case ${1:-} in
up) up ;;
push) push ;;
down) down ;;
address) echo "$REGISTRY" ;;
*)
	echo "usage: $0 up|push [kind|local] | down | address" >&2
	exit 2
	;;
esac
