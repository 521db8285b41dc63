# shellcheck shell=bash
# Shared state, logging and process handling for hack/local-cluster.sh.
# Everything the local cluster writes lives under GYMKUBE_CLUSTER_DIR (files) and
# GYMKUBE_CLUSTER_RUN_DIR (sockets and runtime state), so `down` can remove it all.

# shellcheck source=tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"

COREDNS_VERSION=v1.14.7

# Path of the CoreDNS binary, built from the Go module proxy when missing (needs cluster-gobuild.sh).
# The local cluster runs it on the host; kind's node image (hack/kind-node-image.sh) packs it.
coredns_bin() {
	gobuild_tool coredns github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns \
		"-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
}

CLUSTER_DIR=${GYMKUBE_CLUSTER_DIR:-$GYMKUBE_CACHE/cluster}
RUN_DIR=${GYMKUBE_CLUSTER_RUN_DIR:-/run/gymkube-cluster}
PKI_DIR=$CLUSTER_DIR/pki
CONF_DIR=$CLUSTER_DIR/conf
LOG_DIR=$CLUSTER_DIR/logs
PID_DIR=$CLUSTER_DIR/pids
KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig
KUBELET_ROOT=$CLUSTER_DIR/kubelet
CONTAINERD_ROOT=$CLUSTER_DIR/containerd
CONTAINERD_STATE=$RUN_DIR/containerd
CONTAINERD_SOCK=$RUN_DIR/containerd.sock
# Registry hosts (hosts.toml per registry) the local cluster's containerd reads at each pull.
REGISTRY_HOSTS_DIR=$CONF_DIR/certs.d
CNI_CONF_DIR=$CLUSTER_DIR/cni/net.d
CNI_IPAM_DIR=$CLUSTER_DIR/cni/ipam
CNI_BIN_DIR=${GYMKUBE_CNI_BIN_DIR:-/usr/lib/cni}

NODE_NAME=${GYMKUBE_NODE_NAME:-gymkube-node}
ETCD_PORT=${GYMKUBE_ETCD_PORT:-23790}
APISERVER_PORT=${GYMKUBE_APISERVER_PORT:-6443}
SERVICE_CIDR=10.0.0.0/24
SERVICE_FIRST_IP=10.0.0.1
POD_CIDR=10.88.0.0/16
CNI_BRIDGE=gymkube0
# CoreDNS runs on the host and listens on the bridge's gateway address, which every pod reaches
# directly (no kube-proxy hop), so that address is the pods' nameserver.
BRIDGE_IP=10.88.0.1
CLUSTER_DOMAIN=cluster.local
# kubelet cgroup root, created in every cgroup v1 hierarchy; every pod, containerd and its shims
# live below it, which is how `down` finds every process it must stop.
CGROUP_NAME=gymkube
# Tag of the locally built sandbox image (hack/pause/pause.c); containerd runs every pod with it.
PAUSE_IMAGE=gymkube.local/pause:1.0
# Tiny image (static busybox from Debian) used by the smoke test.
BUSYBOX_IMAGE=gymkube.local/busybox:1.35
# Every iptables rule this script adds directly carries this comment.
IPT_COMMENT=gymkube-local-cluster

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

require_root() {
	[[ $(id -u) == 0 ]] || die "the local cluster runs containerd and a kubelet, which need root"
}

kubectl_admin() { "$GYMKUBE_BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

pid_of() {
	local file=$PID_DIR/$1.pid pid
	[[ -f $file ]] || return 1
	pid=$(<"$file")
	# The PID must still be the binary we started (PIDs get reused after a reboot or crash).
	[[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -- "$1" >/dev/null || return 1
	echo "$pid"
}

is_running() { pid_of "$1" >/dev/null; }

# start_component NAME BINARY ARGS...: runs BINARY in its own session, logging to logs/NAME.log.
start_component() {
	local name=$1
	shift
	if is_running "$name"; then
		return 0
	fi
	mkdir -p "$LOG_DIR" "$PID_DIR"
	setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
	echo $! >"$PID_DIR/$name.pid"
	# Until the child has exec'd, its cmdline is this script's and is_running says no: a check
	# straight after the start took a starting component for one that had exited.
	local _
	for _ in {1..20}; do
		is_running "$name" && return 0
		sleep 0.1
	done
}

# stop_components NAME...: SIGTERM to all at once, then SIGKILL to any still running after 10s.
stop_components() {
	local name pid pids=() waited
	for name in "$@"; do
		if pid=$(pid_of "$name"); then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
		rm -f "$PID_DIR/$name.pid"
	done
	for ((waited = 0; waited < 100 && ${#pids[@]} > 0; waited++)); do
		for pid in "${!pids[@]}"; do
			kill -0 "${pids[$pid]}" 2>/dev/null || unset 'pids[$pid]'
		done
		((${#pids[@]})) && sleep 0.1
	done
	for pid in "${pids[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
	done
}

# wait_for DESCRIPTION TIMEOUT_S COMMAND...: polls COMMAND until it succeeds.
wait_for() {
	local what=$1 timeout=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS - start < timeout)) || die "timed out after ${timeout}s waiting for $what"
		sleep 0.5
	done
}

# Fails fast with the component's log when it died during start-up.
check_alive() {
	is_running "$1" || die "$1 exited; last lines of $LOG_DIR/$1.log:
$(tail -n 20 "$LOG_DIR/$1.log" 2>/dev/null)"
}

wait_component() {
	local name=$1 timeout=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		check_alive "$name"
		((SECONDS - start < timeout)) || die "$name not ready after ${timeout}s; see $LOG_DIR/$name.log"
		sleep 0.5
	done
}

host_ip() {
	ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n 1
}
