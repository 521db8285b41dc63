#!/usr/bin/env bash
# Makes sure a Docker daemon answers on this machine: installs Debian's docker.io when dockerd is
# missing and starts dockerd in the background when nothing answers (machines without systemd).
#
#   hack/ensure-docker.sh            # idempotent; returns as soon as `docker info` works
#
# The daemon it starts logs to $GYMKUBE_CACHE/docker/dockerd.log and its PID is recorded in
# $GYMKUBE_CACHE/docker/dockerd.pid, so it can be stopped with `kill "$(cat .../dockerd.pid)"`.
# dockerd runs its own containerd (under /var/run/docker), separate from a kubelet's containerd.
set -euo pipefail
# shellcheck source=lib/tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/tools.sh"

DOCKER=${DOCKER:-docker}
STATE_DIR=$GYMKUBE_CACHE/docker
START_TIMEOUT_S=${GYMKUBE_DOCKERD_TIMEOUT_S:-60}

log() { printf 'ensure-docker: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

docker_answers() { "$DOCKER" info >/dev/null 2>&1; }

if docker_answers; then
	exit 0
fi

if ! command -v dockerd >/dev/null; then
	[[ $(id -u) == 0 ]] || die "dockerd is not installed; run as root or install docker.io yourself"
	log "installing docker.io from the Debian archive"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
command -v "$DOCKER" >/dev/null || DOCKER=/usr/bin/docker

if docker_answers; then
	exit 0
fi

[[ $(id -u) == 0 ]] || die "no Docker daemon answers and starting one needs root"
mkdir -p "$STATE_DIR"
if [[ -f $STATE_DIR/dockerd.pid ]] && kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null; then
	log "dockerd (PID $(cat "$STATE_DIR/dockerd.pid")) is starting; waiting for it"
else
	log "starting dockerd (log: $STATE_DIR/dockerd.log)"
	# setsid: the daemon must outlive this script and the make/CI process group that ran it.
	setsid dockerd >>"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
	echo $! >"$STATE_DIR/dockerd.pid"
fi

for ((waited = 0; waited < START_TIMEOUT_S; waited++)); do
	docker_answers && exit 0
	kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null ||
		die "dockerd exited; last lines of $STATE_DIR/dockerd.log: $(tail -n 5 "$STATE_DIR/dockerd.log")"
	sleep 1
done
die "dockerd did not answer within ${START_TIMEOUT_S}s; see $STATE_DIR/dockerd.log"
