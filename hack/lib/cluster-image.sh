# shellcheck shell=bash
# Builds the local cluster's own images without a registry or a Docker daemon: a rootfs directory
# becomes a one-layer image archive in `docker save` format, which `ctr images import` reads.
# Sourced by hack/local-cluster.sh after cluster-common.sh.

# image_archive ROOTFS REF ENTRYPOINT_JSON OUT: writes a docker-save archive of ROOTFS tagged REF.
image_archive() {
	local rootfs=$1 ref=$2 entrypoint=$3 out=$4 work layer_sha config_sha
	work=$(mktemp -d)
	# Fixed owner and mtime keep the layer digest stable, so re-imports are no-ops.
	tar -C "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$work/layer.tar" .
	layer_sha=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
	mkdir "$work/$layer_sha"
	mv "$work/layer.tar" "$work/$layer_sha/layer.tar"
	printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",%s,%s}' \
		"\"config\":{\"Entrypoint\":$entrypoint,\"Env\":[\"PATH=/bin:/usr/bin\"]}" \
		"\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_sha\"]}" >"$work/config.json"
	config_sha=$(sha256sum "$work/config.json" | cut -d' ' -f1)
	mv "$work/config.json" "$work/$config_sha.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
		"$config_sha" "$ref" "$layer_sha" >"$work/manifest.json"
	tar -C "$work" -cf "$out" manifest.json "$config_sha.json" "$layer_sha"
	rm -rf "$work"
}

# The sandbox image: hack/pause/pause.c compiled static, nothing else in the image.
build_pause_archive() {
	local out=$1 rootfs
	command -v gcc >/dev/null || die "gcc is needed to build the pause image (apt-get install gcc libc6-dev)"
	rootfs=$(mktemp -d)
	gcc -Os -Wall -Wextra -Werror -static -o "$rootfs/pause" "$GYMKUBE_HACK_DIR/pause/pause.c" ||
		die "compiling hack/pause/pause.c failed (static glibc comes from libc6-dev)"
	strip "$rootfs/pause"
	image_archive "$rootfs" "$PAUSE_IMAGE" '["/pause"]' "$out"
	rm -rf "$rootfs"
}

# A shell-and-tools image from Debian's static busybox, for smoke tests (httpd, nc, nslookup).
build_busybox_archive() {
	local out=$1 rootfs
	[[ -x /bin/busybox ]] || die "/bin/busybox is missing (apt-get install busybox-static)"
	# ldd fails on a static binary; the image has no libc for a dynamic one.
	! ldd /bin/busybox >/dev/null 2>&1 || die "/bin/busybox is not static (apt-get install busybox-static)"
	rootfs=$(mktemp -d)
	mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/www"
	cp /bin/busybox "$rootfs/bin/busybox"
	local applet
	for applet in sh httpd nc nslookup cat printf sleep; do
		ln -s busybox "$rootfs/bin/$applet"
	done
	image_archive "$rootfs" "$BUSYBOX_IMAGE" '["/bin/sh"]' "$out"
	rm -rf "$rootfs"
}

# import_archive FILE: loads an image archive into the k8s.io namespace the kubelet uses.
import_archive() {
	ctr_k8s images import "$1" >/dev/null
}

# Rebuilt and re-imported on every `up` (about a second): a changed recipe takes effect, and an
# unchanged one imports as a no-op because the layers are reproducible.
ensure_local_images() {
	local archive
	archive=$(mktemp)
	build_pause_archive "$archive"
	import_archive "$archive"
	build_busybox_archive "$archive"
	import_archive "$archive"
	rm -f "$archive"
}
