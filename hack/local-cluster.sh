#!/usr/bin/env bash
# A single-node Kubernetes cluster from host processes, for machines where kind's node image cannot
# be pulled (no registry). Needs root, a cgroup v1 host and Debian's containerd, runc and CNI plugins
# (installed with apt-get when missing). Kubernetes binaries come from hack/build-tools.sh.
#
#   hack/local-cluster.sh up                 # idempotent; prints the kubeconfig path
#   hack/local-cluster.sh status
#   hack/local-cluster.sh load-image IMG...  # docker save IMG | ctr -n k8s.io images import -
#   hack/local-cluster.sh smoke              # pod + Service + DNS check with a locally built image
#   hack/local-cluster.sh down               # stops and removes everything `up` made
#   hack/local-cluster.sh kubeconfig         # prints the kubeconfig path
#
# Layout: files under $GYMKUBE_CLUSTER_DIR (default ~/.cache/gymkube/cluster), sockets and runtime
# state under $GYMKUBE_CLUSTER_RUN_DIR (default /run/gymkube-cluster). docs/cluster.md has the rest.
set -euo pipefail
HACK_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")/lib" && pwd)
# shellcheck source=lib/cluster-common.sh
source "$HACK_LIB/cluster-common.sh"
# shellcheck source=lib/cluster-gobuild.sh
source "$HACK_LIB/cluster-gobuild.sh"
# shellcheck source=lib/cluster-pki.sh
source "$HACK_LIB/cluster-pki.sh"
# shellcheck source=lib/cluster-image.sh
source "$HACK_LIB/cluster-image.sh"
# shellcheck source=lib/cluster-host.sh
source "$HACK_LIB/cluster-host.sh"

KUBE_TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
DEBIAN_PACKAGES=(containerd runc containernetworking-plugins iptables busybox-static gcc libc6-dev)

ensure_packages() {
	local missing=() pkg
	for pkg in "${DEBIAN_PACKAGES[@]}"; do
		dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$pkg")
	done
	((${#missing[@]})) || return 0
	log "installing ${missing[*]} from the Debian archive"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_binaries() {
	"$GYMKUBE_HACK_DIR/build-tools.sh" "${KUBE_TOOLS[@]}"
	COREDNS_BIN=$(coredns_bin)
}

start_etcd() {
	local peer=http://127.0.0.1:$((ETCD_PORT + 1))
	start_component etcd "$GYMKUBE_BIN_DIR/etcd" --name gymkube --data-dir "$CLUSTER_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "gymkube=$peer" \
		--listen-metrics-urls "" --log-level warn
	wait_component etcd 60 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
}

start_apiserver() {
	local ip=$1
	start_component kube-apiserver "$GYMKUBE_BIN_DIR/kube-apiserver" \
		--advertise-address "$ip" --bind-address 0.0.0.0 --secure-port "$APISERVER_PORT" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" --service-cluster-ip-range "$SERVICE_CIDR" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--client-ca-file "$PKI_DIR/ca.crt" \
		--tls-cert-file "$PKI_DIR/apiserver.crt" --tls-private-key-file "$PKI_DIR/apiserver.key" \
		--kubelet-client-certificate "$PKI_DIR/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI_DIR/apiserver-kubelet-client.key" \
		--service-account-key-file "$PKI_DIR/service-account.key" \
		--service-account-signing-key-file "$PKI_DIR/service-account.key" \
		--service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
		--cert-dir "$PKI_DIR/apiserver-generated"
	wait_component kube-apiserver 120 kubectl_admin get --raw /readyz
}

start_controller_manager() {
	local kc=$CONF_DIR/controller-manager.kubeconfig
	start_component kube-controller-manager "$GYMKUBE_BIN_DIR/kube-controller-manager" \
		--kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
		--bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
		--service-account-private-key-file "$PKI_DIR/service-account.key" --root-ca-file "$PKI_DIR/ca.crt" \
		--cluster-signing-cert-file "$PKI_DIR/ca.crt" --cluster-signing-key-file "$PKI_DIR/ca.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" --cert-dir "$PKI_DIR/controller-manager-generated"
}

start_scheduler() {
	local kc=$CONF_DIR/scheduler.kubeconfig
	cat >"$CONF_DIR/kube-scheduler.yaml" <<-YAML
		apiVersion: kubescheduler.config.k8s.io/v1
		kind: KubeSchedulerConfiguration
		clientConnection: {kubeconfig: $kc}
		leaderElection: {leaderElect: false}
	YAML
	start_component kube-scheduler "$GYMKUBE_BIN_DIR/kube-scheduler" --config "$CONF_DIR/kube-scheduler.yaml" \
		--authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" --bind-address 127.0.0.1 \
		--cert-dir "$PKI_DIR/scheduler-generated"
}

# The apiserver calls the kubelet (logs, exec) as user kube-apiserver.
ensure_rbac() {
	kubectl_admin create clusterrolebinding gymkube-apiserver-kubelet-admin \
		--clusterrole system:kubelet-api-admin --user kube-apiserver --dry-run=client -o yaml |
		kubectl_admin apply -f - >/dev/null
}

write_cni_config() {
	local mtu
	# Pod interfaces must not be wider than the host's uplink.
	mtu=$(ip -o link show "$(ip -4 route show default | awk '{print $5; exit}')" | sed -n 's/.* mtu \([0-9]*\).*/\1/p')
	mkdir -p "$CNI_CONF_DIR" "$CNI_IPAM_DIR"
	cat >"$CNI_CONF_DIR/10-gymkube.conflist" <<-JSON
		{
		  "cniVersion": "1.0.0",
		  "name": "gymkube",
		  "plugins": [
		    {"type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "ipMasq": false, "mtu": $mtu,
		     "hairpinMode": true,
		     "ipam": {"type": "host-local", "dataDir": "$CNI_IPAM_DIR",
		              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$BRIDGE_IP"}]],
		              "routes": [{"dst": "0.0.0.0/0"}]}},
		    {"type": "portmap", "capabilities": {"portMappings": true}}
		  ]
		}
	JSON
}

start_containerd() {
	local config=$CONF_DIR/containerd.toml
	mkdir -p "$CONTAINERD_ROOT" "$CONTAINERD_STATE"
	# Its own socket, root and state: Docker's containerd (if any) is left alone.
	cat >"$config" <<-TOML
		version = 2
		root = "$CONTAINERD_ROOT"
		state = "$CONTAINERD_STATE"
		[grpc]
		  address = "$CONTAINERD_SOCK"
		[ttrpc]
		  address = "$CONTAINERD_SOCK.ttrpc"
		[plugins."io.containerd.internal.v1.opt"]
		  path = "$CLUSTER_DIR/containerd-opt"
		[plugins."io.containerd.grpc.v1.cri"]
		  sandbox_image = "$PAUSE_IMAGE"
		  netns_mounts_under_state_dir = true
		  # Clamp oom_score_adj at containerd's own: lowering it needs CAP_SYS_RESOURCE, which
		  # sandboxed hosts (and rootless setups) lack, and then every pod fails to start.
		  restrict_oom_score_adj = true
		  [plugins."io.containerd.grpc.v1.cri".containerd]
		    snapshotter = "overlayfs"
		    default_runtime_name = "runc"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
		        SystemdCgroup = false
		        Root = "$RUN_DIR/runc"
		  [plugins."io.containerd.grpc.v1.cri".cni]
		    bin_dir = "$CNI_BIN_DIR"
		    conf_dir = "$CNI_CONF_DIR"
		  [plugins."io.containerd.grpc.v1.cri".registry]
		    config_path = "$REGISTRY_HOSTS_DIR"
	TOML
	if ! is_running containerd; then
		start_component containerd containerd --config "$config"
		join_cgroup containerd
	fi
	wait_component containerd 60 ctr --address "$CONTAINERD_SOCK" version
}

start_kubelet() {
	local ip=$1
	mkdir -p "$KUBELET_ROOT" "$CLUSTER_DIR/pod-logs"
	cat >"$CONF_DIR/kubelet.yaml" <<-YAML
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		cgroupDriver: cgroupfs
		cgroupRoot: /$CGROUP_NAME
		cgroupsPerQOS: true
		failCgroupV1: false
		failSwapOn: false
		containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
		podLogsDir: $CLUSTER_DIR/pod-logs
		readOnlyPort: 0
		healthzBindAddress: 127.0.0.1
		rotateCertificates: false
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: $PKI_DIR/ca.crt}
		authorization: {mode: Webhook}
		clusterDNS: [$BRIDGE_IP]
		clusterDomain: $CLUSTER_DOMAIN
		resolvConf: /etc/resolv.conf
		serializeImagePulls: false
		# The kubelet sees the whole host disk, which other work fills: never evict pods or GC
		# images for disk (image GC would also drop the pause image, which no registry can restore).
		imageGCHighThresholdPercent: 100
		evictionHard: {memory.available: 100Mi, nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
	YAML
	start_component kubelet "$GYMKUBE_BIN_DIR/kubelet" --config "$CONF_DIR/kubelet.yaml" \
		--kubeconfig "$CONF_DIR/kubelet.kubeconfig" --root-dir "$KUBELET_ROOT" \
		--hostname-override "$NODE_NAME" --node-ip "$ip" --cert-dir "$PKI_DIR/kubelet-generated"
}

start_kube_proxy() {
	# kube-proxy exits when its config file is written, even with the same content: a running one
	# keeps the file it started with (`up` twice must not stop it).
	is_running kube-proxy && return 0
	cat >"$CONF_DIR/kube-proxy.yaml" <<-YAML
		apiVersion: kubeproxy.config.k8s.io/v1alpha1
		kind: KubeProxyConfiguration
		clientConnection: {kubeconfig: $CONF_DIR/kube-proxy.kubeconfig}
		hostnameOverride: $NODE_NAME
		mode: iptables
		clusterCIDR: $POD_CIDR
		metricsBindAddress: 127.0.0.1:10249
		healthzBindAddress: 127.0.0.1:10256
		# 0 leaves the host's global conntrack sysctls alone.
		conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
	YAML
	start_component kube-proxy "$GYMKUBE_BIN_DIR/kube-proxy" --config "$CONF_DIR/kube-proxy.yaml"
}

start_coredns() {
	cat >"$CONF_DIR/Corefile" <<-COREFILE
		.:53 {
		    bind $BRIDGE_IP
		    errors
		    health 127.0.0.1:18080
		    ready 127.0.0.1:18181
		    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
		        kubeconfig $CONF_DIR/admin.kubeconfig
		        pods insecure
		        fallthrough in-addr.arpa ip6.arpa
		        ttl 30
		    }
		    forward . /etc/resolv.conf
		    cache 30
		    loop
		    loadbalance
		}
	COREFILE
	start_component coredns "$COREDNS_BIN" -conf "$CONF_DIR/Corefile"
	wait_component coredns 60 curl -fsS http://127.0.0.1:18181/ready
}

cmd_up() {
	require_root
	local start=$SECONDS ip
	ip=$(host_ip)
	[[ -n $ip ]] || die "no default route: cannot tell which host address pods should reach the API on"
	mkdir -p "$CLUSTER_DIR" "$RUN_DIR" "$LOG_DIR" "$PID_DIR"
	ensure_packages
	ensure_binaries
	log "host facts: cgroup $(stat -fc %T /sys/fs/cgroup), address $ip"
	ensure_cgroups
	ensure_sysctls
	save_kernel_tunables
	ensure_pki "$ip"
	remember_if_missing /var/lib/cni /var/log/containers
	ensure_bridge
	ensure_iptables
	write_cni_config

	start_etcd
	start_apiserver "$ip"
	ensure_rbac
	start_controller_manager
	start_scheduler
	start_containerd
	ensure_local_images
	start_kubelet "$ip"
	start_kube_proxy
	start_coredns
	wait_component kubelet 120 kubectl_admin get node "$NODE_NAME"
	wait_component kubelet 120 kubectl_admin wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
	wait_component kube-controller-manager 60 kubectl_admin get serviceaccount default -n default
	check_alive kube-scheduler
	check_alive kube-proxy
	log "cluster up in $((SECONDS - start))s; node $NODE_NAME Ready"
	log "export KUBECONFIG=$KUBECONFIG_PATH"
	echo "$KUBECONFIG_PATH"
}

cmd_down() {
	require_root
	local start=$SECONDS path id
	stop_components coredns kube-proxy kube-scheduler kube-controller-manager kubelet
	# Ask containerd to remove its containers while it still runs (shims clean up after
	# themselves); whatever is left in the cgroup is killed below.
	local containers=()
	if is_running containerd; then
		mapfile -t containers < <(ctr_k8s containers ls -q 2>/dev/null || true)
		for id in $(ctr_k8s tasks ls -q 2>/dev/null || true); do
			ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
			ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true
		done
	fi
	stop_components containerd
	kill_cgroup_processes
	stop_components kube-apiserver etcd
	unmount_all
	if [[ -x $GYMKUBE_BIN_DIR/kube-proxy ]]; then
		"$GYMKUBE_BIN_DIR/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	remove_iptables
	remove_bridge
	remove_cgroups
	restore_kernel_tunables
	# libcni caches each attachment's result under /var/lib/cni, named after the container.
	for id in "${containers[@]}"; do
		rm -f /var/lib/cni/results/*-"$id"-* 2>/dev/null || true
	done
	find /var/log/containers -maxdepth 1 -type l -lname "$CLUSTER_DIR/*" -delete 2>/dev/null || true
	if [[ -f $CREATED_PATHS_FILE ]]; then
		while IFS= read -r path; do
			find "$path" -depth -type d -empty -delete 2>/dev/null || true
		done <"$CREATED_PATHS_FILE"
	fi
	rm -rf "$CLUSTER_DIR" "$RUN_DIR"
	log "cluster removed in $((SECONDS - start))s"
}

cmd_status() {
	local component pid rc=0
	for component in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns; do
		if pid=$(pid_of "$component"); then
			printf '%-24s running (pid %s)\n' "$component" "$pid"
		else
			printf '%-24s stopped\n' "$component"
			rc=1
		fi
	done
	if ((rc == 0)); then
		kubectl_admin get nodes -o wide
		echo "KUBECONFIG=$KUBECONFIG_PATH"
	fi
	return "$rc"
}

cmd_load_image() {
	require_root
	(($#)) || die "usage: $0 load-image IMAGE..."
	is_running containerd || die "the local cluster is not up (run: $0 up)"
	command -v docker >/dev/null || die "docker is needed to export images"
	log "loading $*"
	# One archive for all: layers the images share are exported and imported once.
	docker save "$@" | ctr_k8s images import - >/dev/null ||
		die "could not load $* (does \`docker image inspect\` find each of them?)"
}

main() {
	local cmd=${1:-}
	(($#)) && shift
	case $cmd in
	up) cmd_up ;;
	down) cmd_down ;;
	status) cmd_status ;;
	load-image) cmd_load_image "$@" ;;
	smoke) "$HACK_LIB/cluster-smoke.sh" "$KUBECONFIG_PATH" "$BUSYBOX_IMAGE" ;;
	kubeconfig) echo "$KUBECONFIG_PATH" ;;
	*) die "usage: $0 up|down|status|load-image IMAGE...|smoke|kubeconfig" ;;
	esac
}

main "$@"
