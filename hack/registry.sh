#!/usr/bin/env bash
# The e2e suite's registry: the CNCF distribution registry (built by hack/build-tools.sh, in an
# image on gymkube's base), as a container on the kind cluster's Docker network, so the node's
# kubelet pulls gymkube's images the way a user's cluster does.
#
#   hack/registry.sh up      # the registry running, the kind node told where it is
#   hack/registry.sh push    # the images pushed (make push REGISTRY=localhost:5001)
#   hack/registry.sh down    # the registry container removed
#   hack/registry.sh address # localhost:5001
#
# Both Docker here and the node name it localhost:5001 (Docker publishes it on 127.0.0.1; the
# node's containerd maps it to http://gymkube-registry:5000 on the kind network), so one image
# name works for the push and for the pull. Plain HTTP: Docker allows it for localhost.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"
cd "$HACK_DIR/.."

REGISTRY=localhost:5001
CONTAINER=gymkube-registry
IMAGE=gymkube/e2e-registry:$DISTRIBUTION_VERSION
NODE=$KIND_NAME-control-plane
# What `docker push` sends (compressed, so the node downloads it for real): the images of the
# operator and of a pool. The others are pushed from the node's own store instead, as they are
# (gzip of the CPU trainer's 7 GB would take many minutes on 2 cores), so their pull fetches
# only the manifests.
DOCKER_PUSHED=(operator envserver router)
NODE_PUSHED=(preflight trainer-cpu)

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
	docker exec -i "$NODE" sh -c "mkdir -p /etc/containerd/certs.d/$REGISTRY &&
		cat >/etc/containerd/certs.d/$REGISTRY/hosts.toml" <<HOSTS
server = "http://$CONTAINER:5000"
[host."http://$CONTAINER:5000"]
  capabilities = ["pull", "resolve", "push"]
HOSTS
}

up() {
	kind_cluster_exists || { say "error: no kind cluster $KIND_NAME (hack/kind-up.sh)"; exit 2; }
	build_image
	if [[ $(docker inspect --format '{{.State.Running}}' "$CONTAINER" 2>/dev/null) != true ]]; then
		docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
		docker run -d --name "$CONTAINER" --network kind -p "127.0.0.1:${REGISTRY#*:}:5000" \
			--restart unless-stopped "$IMAGE" >/dev/null
	fi
	for _ in $(seq 50); do
		curl -fsS -o /dev/null "http://$REGISTRY/v2/" && break
		sleep 0.2
	done
	curl -fsS -o /dev/null "http://$REGISTRY/v2/" || { say "error: $CONTAINER does not answer on $REGISTRY"; exit 1; }
	node_hosts
	say "up: $REGISTRY (container $CONTAINER on the kind network)"
}

# A node that pulled from the registry in an earlier run (a kind cluster kept up between runs)
# still holds those images under the same names: the kubelet (IfNotPresent) would start them, an
# older build, and pull nothing. Forgotten before each push, so the suite pulls what it pushed.
forget_pulled() {
	docker exec "$NODE" sh -c "ctr -n k8s.io images ls -q | grep '^$REGISTRY/' |
		xargs -r ctr -n k8s.io images rm >/dev/null" ||
		{ say "error: removing the images $NODE pulled from $REGISTRY earlier failed"; exit 1; }
}

push() {
	local start=$SECONDS tag name ref
	forget_pulled
	.venv/bin/python -m gymkube_dev.push "$REGISTRY" "${DOCKER_PUSHED[@]}" >&2
	tag=$(.venv/bin/python -m gymkube_dev.images tag)
	for name in "${NODE_PUSHED[@]}"; do
		ref=$REGISTRY/gymkube/$name:$tag
		# Tagged only for the push, then untagged: the kubelet must not find it under that name.
		docker exec "$NODE" sh -c "ctr -n k8s.io images tag --force docker.io/gymkube/$name:$tag $ref >/dev/null &&
			ctr -n k8s.io images push --hosts-dir /etc/containerd/certs.d $ref docker.io/gymkube/$name:$tag >/dev/null;
			rc=\$?; ctr -n k8s.io images rm $ref >/dev/null; exit \$rc" ||
			{ say "error: pushing $ref from $NODE failed"; exit 1; }
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
	echo "usage: $0 up|push|down|address" >&2
	exit 2
	;;
esac
