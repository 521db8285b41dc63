# shellcheck shell=bash
# Shared by the scripts that debootstrap a root filesystem (hack/base-image.sh, hack/kind-node-image.sh).

# The first Debian archive URI in apt's sources (deb822 or one-line format), so the base image comes
# from the same mirror (or snapshot) the host trusts.
apt_mirror() {
	local uri
	uri=$(
		cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
			grep -oE '(https?|file)://[^ ]*/debian/?( |$)' | grep -v -- '-security' | head -n 1
	) || true
	echo "${uri:-http://deb.debian.org/debian}" | tr -d ' '
}

ensure_debootstrap() {
	command -v debootstrap >/dev/null && return
	log "installing debootstrap from the Debian archive"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
