#!/usr/bin/env bash
# Makes sure a Docker daemon answers on this machine: installs Debian's docker.io when dockerd is
# missing and starts dockerd in the background when nothing answers (machines without systemd).
#
#   hack/ensure-docker.sh            # idempotent; returns as soon as `docker info` works
#
# The daemon it starts logs to $GYMKUBE_CACHE/docker/dockerd.log and its PID is recorded in
# $GYMKUBE_CACHE/docker/dockerd.pid, so it can be stopped with `kill "$(cat .../dockerd.pid)"`.
# dockerd runs its own containerd (under /var/run/docker), separate from a kubelet's containerd.
#
# Privileged containers (every kind node is one): Debian's docker.io 20.10 gives them every capability
# it knows, which goes wrong twice: where the host's bounding set lacks one, runc fails "unable to
# apply caps" (moby#42933), and it knows none newer than CAP_AUDIT_READ, so kind's pods get no
# CAP_BPF or CAP_PERFMON (Cilium, the e2e cluster's CNI, needs them). The daemon started here gets
# hack/kind/runc-host-caps as its default runtime (`--add-runtime gymkube-runc=...
# --default-runtime gymkube-runc`), which fixes both; an older copy of it is replaced on each run.
# A daemon you run yourself needs the same in /etc/docker/daemon.json where it is 20.10 or the host
# lacks capabilities:
#   {"runtimes": {"gymkube-runc": {"path": "/path/to/runc-host-caps"}}, "default-runtime": "gymkube-runc"}
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

RUNTIME_NAME=gymkube-runc
RUNTIME_WRAPPER=$STATE_DIR/runc-host-caps

docker_answers() { "$DOCKER" info >/dev/null 2>&1; }

# True when the bounding set lacks a capability the kernel has (Docker's --privileged asks for all).
host_lacks_caps() {
	local bounding last
	bounding=$((16#$(awk '$1 == "CapBnd:" {print $2}' /proc/self/status)))
	last=$(cat /proc/sys/kernel/cap_last_cap)
	((bounding != (1 << (last + 1)) - 1))
}

# The runtime wrapper where dockerd runs it, kept current (dockerd runs the file for each container).
install_wrapper() {
	command -v jq >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null
	cmp -s "$GYMKUBE_HACK_DIR/kind/runc-host-caps" "$RUNTIME_WRAPPER" ||
		install -D -m 0755 "$GYMKUBE_HACK_DIR/kind/runc-host-caps" "$RUNTIME_WRAPPER"
}

# A running daemon: keep our wrapper current, or say when privileged containers will fail.
check_running_daemon() {
	if [[ $("$DOCKER" info --format '{{.DefaultRuntime}}' 2>/dev/null) == "$RUNTIME_NAME" ]]; then
		install_wrapper
		return 0
	fi
	host_lacks_caps || return 0
	log "warning: this host's capability bounding set is incomplete, and the running dockerd's default"
	log "runtime is not $RUNTIME_NAME: privileged containers (kind nodes) will fail; see the top of $0"
}

if docker_answers; then
	check_running_daemon
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
	check_running_daemon
	exit 0
fi

[[ $(id -u) == 0 ]] || die "no Docker daemon answers and starting one needs root"
mkdir -p "$STATE_DIR"
if [[ -f $STATE_DIR/dockerd.pid ]] && kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null; then
	log "dockerd (PID $(cat "$STATE_DIR/dockerd.pid")) is starting; waiting for it"
else
	# A copy, so the daemon does not depend on this checkout staying where it is.
	install_wrapper
	log "starting dockerd with default runtime $RUNTIME_NAME ($RUNTIME_WRAPPER; log: $STATE_DIR/dockerd.log)"
	# setsid: the daemon must outlive this script and the make/CI process group that ran it.
	setsid dockerd --add-runtime "$RUNTIME_NAME=$RUNTIME_WRAPPER" --default-runtime "$RUNTIME_NAME" \
		>>"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
	echo $! >"$STATE_DIR/dockerd.pid"
fi

for ((waited = 0; waited < START_TIMEOUT_S; waited++)); do
	docker_answers && exit 0
	kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null ||
		die "dockerd exited; last lines of $STATE_DIR/dockerd.log: $(tail -n 5 "$STATE_DIR/dockerd.log")"
	sleep 1
done
die "dockerd did not answer within ${START_TIMEOUT_S}s; see $STATE_DIR/dockerd.log"
