# shellcheck shell=bash
# Host plumbing for the local cluster: sysctls, cgroups, the pod bridge, iptables, and their
# removal. Sourced by hack/local-cluster.sh after cluster-common.sh.

# Paths outside CLUSTER_DIR/RUN_DIR that did not exist before `up`; `down` removes them if empty.
CREATED_PATHS_FILE=$CLUSTER_DIR/created-paths

remember_if_missing() {
	local path
	for path in "$@"; do
		[[ -e $path ]] || echo "$path" >>"$CREATED_PATHS_FILE"
	done
}

# The kubelet sets these kernel tunables at start (kubelet protectKernelDefaults=false); `down`
# puts back the values the host had before `up`.
KUBELET_TUNABLES=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
SAVED_TUNABLES_FILE=$CLUSTER_DIR/sysctl-before-up

save_kernel_tunables() {
	[[ -f $SAVED_TUNABLES_FILE ]] && return 0
	local key
	for key in "${KUBELET_TUNABLES[@]}"; do
		echo "$key=$(sysctl -n "$key")"
	done >"$SAVED_TUNABLES_FILE"
}

restore_kernel_tunables() {
	[[ -f $SAVED_TUNABLES_FILE ]] || return 0
	local setting
	while IFS= read -r setting; do
		sysctl -qw "$setting" || log "warning: could not restore $setting"
	done <"$SAVED_TUNABLES_FILE"
}

ensure_sysctls() {
	sysctl -qw net.ipv4.ip_forward=1
	if [[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
		modprobe br_netfilter 2>/dev/null ||
			die "br_netfilter is unavailable; without it pods cannot reach Services backed by pods on the same bridge"
	fi
	sysctl -qw net.bridge.bridge-nf-call-iptables=1
}

cgroup_hierarchies() {
	awk '$3 == "cgroup" {print $2}' /proc/mounts
}

ensure_cgroups() {
	[[ $(stat -fc %T /sys/fs/cgroup) == tmpfs ]] ||
		die "this script configures a cgroup v1 host (found $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup); use kind on cgroup v2 hosts"
	local hierarchy sub
	for hierarchy in $(cgroup_hierarchies); do
		for sub in "$CGROUP_NAME" "$CGROUP_NAME/containerd"; do
			mkdir -p "$hierarchy/$sub"
			# A new cpuset cgroup starts with no CPUs or memory nodes; tasks cannot join it until they are copied.
			if [[ -f $hierarchy/$sub/cpuset.cpus ]]; then
				cat "$hierarchy/cpuset.cpus" >"$hierarchy/$sub/cpuset.cpus"
				cat "$hierarchy/cpuset.mems" >"$hierarchy/$sub/cpuset.mems"
			fi
		done
	done
}

# join_cgroup COMPONENT: moves the component's process (containerd) below the cluster's cgroup, so
# its shims land there too.
join_cgroup() {
	local hierarchy attempt pid
	for hierarchy in $(cgroup_hierarchies); do
		# Right after start the process may not have exec'd yet (its PID does not name the binary),
		# and EINVAL was seen once while containerd was starting its threads: a moment later both
		# are fine.
		for attempt in 1 2 3 4 5 6 7 8 9 10; do
			pid=$(pid_of "$1") && echo "$pid" 2>/dev/null >"$hierarchy/$CGROUP_NAME/$1/cgroup.procs" && break
			((attempt < 10)) || die "could not move $1 (pid ${pid:-unknown}) into $hierarchy/$CGROUP_NAME/$1"
			sleep 1
		done
	done
}

cgroup_pids() {
	local memory
	memory=$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ {print $2}' /proc/mounts)
	[[ -d $memory/$CGROUP_NAME ]] || return 0
	find "$memory/$CGROUP_NAME" -name cgroup.procs -exec cat {} + 2>/dev/null
}

# Kills every process left below the cluster cgroup (containers, shims). Freezing first means
# nothing forks a replacement while we kill.
kill_cgroup_processes() {
	local freezer pid attempt
	freezer=$(awk '$3 == "cgroup" && $4 ~ /(^|,)freezer(,|$)/ {print $2}' /proc/mounts)
	for ((attempt = 0; attempt < 50; attempt++)); do
		[[ -n $(cgroup_pids) ]] || return 0
		[[ -d $freezer/$CGROUP_NAME ]] && echo FROZEN >"$freezer/$CGROUP_NAME/freezer.state"
		for pid in $(cgroup_pids); do
			kill -KILL "$pid" 2>/dev/null || true
		done
		[[ -d $freezer/$CGROUP_NAME ]] && echo THAWED >"$freezer/$CGROUP_NAME/freezer.state"
		sleep 0.2
	done
	log "warning: processes still in cgroup $CGROUP_NAME: $(cgroup_pids | tr '\n' ' ')"
}

remove_cgroups() {
	local hierarchy
	# runc also mirrors v1 cgroups into the hybrid cgroup2 mount (/sys/fs/cgroup/unified).
	for hierarchy in $(cgroup_hierarchies) $(awk '$3 == "cgroup2" {print $2}' /proc/mounts); do
		[[ -d $hierarchy/$CGROUP_NAME ]] || continue
		find "$hierarchy/$CGROUP_NAME" -depth -type d -exec rmdir {} + 2>/dev/null ||
			log "warning: could not remove every cgroup below $hierarchy/$CGROUP_NAME"
	done
}

ensure_bridge() {
	if ! ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
		ip link add "$CNI_BRIDGE" type bridge
	fi
	# The address exists before the first pod, so CoreDNS can listen on it from the start.
	ip addr show dev "$CNI_BRIDGE" | grep "inet $BRIDGE_IP/" >/dev/null ||
		ip addr add "$BRIDGE_IP/${POD_CIDR#*/}" dev "$CNI_BRIDGE"
	ip link set "$CNI_BRIDGE" up
}

remove_bridge() {
	local veth
	ip link show "$CNI_BRIDGE" >/dev/null 2>&1 || return 0
	for veth in $(ip -o link show master "$CNI_BRIDGE" | awk -F': ' '{print $2}' | cut -d@ -f1); do
		ip link del "$veth" 2>/dev/null || true
	done
	ip link del "$CNI_BRIDGE"
}

ipt_ensure() {
	local table=$1 chain=$2
	shift 2
	iptables -t "$table" -C "$chain" "$@" -m comment --comment "$IPT_COMMENT" 2>/dev/null ||
		iptables -t "$table" -I "$chain" 1 "$@" -m comment --comment "$IPT_COMMENT"
}

ensure_iptables() {
	command -v iptables >/dev/null || die "iptables is missing (apt-get install iptables)"
	# Docker sets the FORWARD policy to DROP; pod traffic through the bridge must pass.
	ipt_ensure filter FORWARD -i "$CNI_BRIDGE" -j ACCEPT
	ipt_ensure filter FORWARD -o "$CNI_BRIDGE" -j ACCEPT
	ipt_ensure nat POSTROUTING -s "$POD_CIDR" ! -o "$CNI_BRIDGE" -j MASQUERADE
}

# Removes our tagged rules, every rule jumping to a KUBE-* or CNI-* chain (kubelet, kube-proxy and
# CNI plugins made those on our behalf), then those chains themselves.
remove_iptables() {
	local cmd table line chain
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null || continue
		for table in filter nat mangle; do
			"$cmd" -t "$table" -S >/dev/null 2>&1 || continue
			while IFS= read -r line; do
				chain=${line#-A }
				chain=${chain%% *}
				[[ $chain == KUBE-* || $chain == CNI-* ]] && continue
				if [[ $line == *"$IPT_COMMENT"* || $line =~ -j\ (KUBE|CNI)- ]]; then
					eval "$cmd -t $table -D ${line#-A }" || true
				fi
			done < <("$cmd" -t "$table" -S | grep '^-A ')
			for chain in $("$cmd" -t "$table" -S | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
				"$cmd" -t "$table" -F "$chain" 2>/dev/null || true
			done
			for chain in $("$cmd" -t "$table" -S | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
				"$cmd" -t "$table" -X "$chain" 2>/dev/null || true
			done
		done
	done
}

# Unmounts everything below our directories (pod network namespaces too: containerd keeps them
# under its state directory), deepest first.
unmount_all() {
	local mountpoint
	for mountpoint in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($CLUSTER_DIR|$RUN_DIR)(/|$)" |
		awk '{print length, $0}' | sort -rn | cut -d' ' -f2- | uniq); do
		umount "$mountpoint" 2>/dev/null || umount -l "$mountpoint" 2>/dev/null || true
	done
}
