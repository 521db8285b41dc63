#!/usr/bin/env bash
# Builds gymkube's kind node image for the pinned Kubernetes version with no container registry:
# Debian packages (debootstrap), the project's own Kubernetes, etcd and CoreDNS builds, and Go
# modules from the proxy. For hosts where kind's own kindest/node image cannot be pulled;
# hack/kind-up.sh uses kindest/node unchanged wherever it can.
#
#   hack/kind-node-image.sh            # builds when missing or stale (seconds when current); prints the tag
#   hack/kind-node-image.sh --force    # rebuilds even when current
#
# What is in it (docs/cluster.md has the table):
#   - bookworm with systemd, Debian's containerd 1.6 and runc, the CNI plugins, iptables
#   - kubelet, kubeadm, kubectl (hack/build-tools.sh) and crictl ($CRICTL_VERSION)
#   - hack/kind/node/: the entrypoint, containerd's config, the kubelet unit and a ptp CNI config
#     (no kindnetd: kind is told disableDefaultCNI, see hack/kind-up.sh)
#   - /kind/images/*.tar, imported into containerd at boot before the kubelet starts: the control
#     plane, kube-proxy, etcd ($ETCD_VERSION), CoreDNS ($COREDNS_VERSION) and the pause image
# The image carries a label with a hash of its recipe; a matching label means it is current.
# Needs root (debootstrap, chroot) and Docker (hack/ensure-docker.sh).
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kind-common.sh
source "$HACK_DIR/lib/kind-common.sh"
# shellcheck source=lib/cluster-image.sh
source "$HACK_DIR/lib/cluster-image.sh"
# shellcheck source=lib/debian.sh
source "$HACK_DIR/lib/debian.sh"

SUITE=bookworm
# What kind's own base image installs that the node uses, plus Debian's containerd, runc and CNI
# plugins in place of kind's builds.
NODE_PACKAGES=(systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod
	libseccomp2 pigz bash ca-certificates curl jq procps containerd runc containernetworking-plugins)
# kube-proxy programs iptables from inside its own container.
KUBE_PROXY_PACKAGES=(iptables conntrack)
NODE_FILES=$HACK_DIR/kind/node
WORK_DIR=$GYMKUBE_CACHE/kind-node
RECIPE_LABEL=io.gymkube.kind-node-recipe
DOCKER=${DOCKER:-docker}
FORCE=false

for arg in "$@"; do
	case $arg in
	--force) FORCE=true ;;
	*) die "unknown argument '$arg' (usage: hack/kind-node-image.sh [--force])" ;;
	esac
done

# Everything that decides the image's content.
recipe_hash() {
	{
		echo "$SUITE ${NODE_PACKAGES[*]} / ${KUBE_PROXY_PACKAGES[*]}"
		echo "$KUBERNETES_VERSION $ETCD_VERSION $COREDNS_VERSION $CRICTL_VERSION $PAUSE_IMAGE $KIND_POD_SUBNET"
		cat "${BASH_SOURCE[0]}" "$HACK_DIR/lib/cluster-image.sh" "$HACK_DIR/pause/pause.c"
		(cd "$NODE_FILES" && find . -type f | LC_ALL=C sort | xargs sha256sum)
	} | sha256sum | cut -c1-16
}

image_is_current() {
	[[ $("$DOCKER" image inspect --format "{{index .Config.Labels \"$RECIPE_LABEL\"}}" "$KIND_LOCAL_NODE_IMAGE" 2>/dev/null) == "$1" ]]
}

# debootstrap ROOT PACKAGE...: a minimal bookworm with these packages, docs and apt caches removed.
bootstrap() {
	local root=$1 packages
	shift
	packages=$(IFS=,; echo "$*")
	rm -rf "$root"
	mkdir -p "$root" "$WORK_DIR/debs"
	debootstrap --variant=minbase --include="$packages" --cache-dir="$WORK_DIR/debs" \
		"$SUITE" "$root" "$MIRROR" >"$WORK_DIR/debootstrap.log" 2>&1 ||
		die "debootstrap failed; last lines of $WORK_DIR/debootstrap.log: $(tail -n 20 "$WORK_DIR/debootstrap.log")"
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
	find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
}

# single_binary_image BINARY REF ENTRYPOINT OUT: an image holding one static binary in /usr/bin.
single_binary_image() {
	local binary=$1 ref=$2 entrypoint=$3 out=$4 rootfs
	rootfs=$(mktemp -d "$WORK_DIR/image.XXXXXX")
	mkdir -p "$rootfs/usr/bin" "$rootfs/tmp"
	cp "$binary" "$rootfs/usr/bin/"
	image_archive "$rootfs" "$ref" "$entrypoint" "$out"
	rm -rf "$rootfs"
}

# The images kubeadm and the node run, under the names kubeadm asks for (etcd's and CoreDNS's tags
# are the project's pins; hack/kind-up.sh tells kubeadm so), as archives in /kind/images.
write_images() {
	local dir=$1 bin=$GYMKUBE_BIN_DIR component rootfs
	mkdir -p "$dir"
	for component in kube-apiserver kube-controller-manager kube-scheduler; do
		single_binary_image "$bin/$component" "registry.k8s.io/$component:$KUBERNETES_VERSION" \
			"[\"/usr/bin/$component\"]" "$dir/$component.tar"
	done
	single_binary_image "$bin/etcd" "registry.k8s.io/etcd:$KIND_ETCD_IMAGE_TAG" '["/usr/bin/etcd"]' "$dir/etcd.tar"
	rootfs=$(mktemp -d "$WORK_DIR/image.XXXXXX")
	cp "$(coredns_bin)" "$rootfs/coredns"
	image_archive "$rootfs" "registry.k8s.io/coredns/coredns:$KIND_COREDNS_IMAGE_TAG" '["/coredns"]' "$dir/coredns.tar"
	rm -rf "$rootfs"
	build_pause_archive "$dir/pause.tar"

	# kubeadm's kube-proxy DaemonSet runs /usr/local/bin/kube-proxy; here that first points
	# iptables at the backend the node uses, then runs the real binary.
	rootfs=$WORK_DIR/rootfs-kube-proxy
	log "debootstrap $SUITE for kube-proxy (${KUBE_PROXY_PACKAGES[*]})"
	bootstrap "$rootfs" "${KUBE_PROXY_PACKAGES[@]}"
	install -m 0755 "$bin/kube-proxy" "$rootfs/usr/local/bin/kube-proxy-bin"
	install -m 0755 "$NODE_FILES/usr/local/bin/iptables-select-mode" "$rootfs/usr/local/bin/"
	# (The image's PATH has no sbin; iptables lives there.)
	printf '#!/bin/sh\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n%s\n' \
		'/usr/local/bin/iptables-select-mode && exec /usr/local/bin/kube-proxy-bin "$@"' >"$rootfs/usr/local/bin/kube-proxy"
	chmod 0755 "$rootfs/usr/local/bin/kube-proxy"
	image_archive "$rootfs" "registry.k8s.io/kube-proxy:$KUBERNETES_VERSION" '["/usr/local/bin/kube-proxy"]' \
		"$dir/kube-proxy.tar"
	rm -rf "$rootfs"
}

# Systemd as PID 1 in a container: only the units a node needs.
configure_systemd() {
	local root=$1
	# Units that manage hardware, terminals or /tmp (a tmpfs kind mounts) have no place in a node.
	rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
		"$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/basic.target.wants/* \
		"$root"/lib/systemd/system/sockets.target.wants/*udev* "$root"/lib/systemd/system/sockets.target.wants/*initctl* \
		"$root"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service
	# The kernel log belongs to the host.
	echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
	ln -sf /lib/systemd/systemd "$root/sbin/init"
	chroot "$root" systemctl enable containerd.service gymkube-images.service kubelet.service >/dev/null 2>&1
	chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
}

build_rootfs() {
	local root=$WORK_DIR/rootfs-node
	log "debootstrap $SUITE for the node (${NODE_PACKAGES[*]})"
	bootstrap "$root" "${NODE_PACKAGES[@]}"
	(cd "$NODE_FILES" && find . -type f) | while read -r file; do
		install -D -m "$(stat -c %a "$NODE_FILES/$file")" "$NODE_FILES/$file" "$root/$file"
	done
	sed -i "s|@PAUSE_IMAGE@|$PAUSE_IMAGE|" "$root/etc/containerd/config.toml"
	sed -i "s|@POD_SUBNET@|$KIND_POD_SUBNET|" "$root/etc/cni/net.d/10-gymkube-ptp.conflist"
	local tool
	for tool in kubelet kubeadm kubectl; do
		install -m 0755 "$GYMKUBE_BIN_DIR/$tool" "$root/usr/bin/$tool"
	done
	install -m 0755 "$(crictl_bin)" "$root/usr/local/bin/crictl"
	mkdir -p "$root/kind" "$root/etc/kubernetes/manifests"
	# kind reads the Kubernetes version from here to write kubeadm's config.
	echo "$KUBERNETES_VERSION" >"$root/kind/version"
	write_images "$root/kind/images"
	configure_systemd "$root"
	echo "$root"
}

crictl_bin() {
	gobuild_tool crictl sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
		"-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
}

main() {
	[[ $(id -u) == 0 ]] || die "building the node image needs root (debootstrap, chroot)"
	"$HACK_DIR/ensure-docker.sh"
	local hash start=$SECONDS root
	hash=$(recipe_hash)
	if ! $FORCE && image_is_current "$hash"; then
		log "$KIND_LOCAL_NODE_IMAGE is current"
		echo "$KIND_LOCAL_NODE_IMAGE"
		return
	fi
	ensure_debootstrap
	MIRROR=${DEBIAN_MIRROR:-$(apt_mirror)}
	"$HACK_DIR/build-tools.sh" "${KIND_NODE_TOOLS[@]}"
	mkdir -p "$WORK_DIR"
	root=$(build_rootfs)
	log "importing $KIND_LOCAL_NODE_IMAGE"
	# `docker import` takes no STOPSIGNAL, so a one-line build on top adds it (the legacy builder
	# uses the local image and pulls nothing). systemd stops cleanly on SIGRTMIN+3.
	tar --numeric-owner -C "$root" -c . | "$DOCKER" import \
		--change 'ENV container=docker' \
		--change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
		- "$KIND_LOCAL_NODE_IMAGE-rootfs" >/dev/null
	rm -rf "$root"
	printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nLABEL %s=%s\n' "$KIND_LOCAL_NODE_IMAGE-rootfs" "$RECIPE_LABEL" "$hash" |
		DOCKER_BUILDKIT=0 "$DOCKER" build -q -t "$KIND_LOCAL_NODE_IMAGE" - >/dev/null 2>"$WORK_DIR/build.log" ||
		die "docker build failed: $(cat "$WORK_DIR/build.log")"
	"$DOCKER" image rm "$KIND_LOCAL_NODE_IMAGE-rootfs" >/dev/null
	log "built $KIND_LOCAL_NODE_IMAGE ($("$DOCKER" image ls --format '{{.Size}}' "$KIND_LOCAL_NODE_IMAGE")) in $((SECONDS - start))s"
	echo "$KIND_LOCAL_NODE_IMAGE"
}

main
