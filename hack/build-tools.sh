#!/usr/bin/env bash
# Builds the pinned Kubernetes tools (hack/versions.env) from the Go module proxy into
# $GYMKUBE_CACHE/bin/<kubernetes version>/ (print it with hack/tool-path.sh).
#
#   hack/build-tools.sh                   # every tool but kubeadm
#   hack/build-tools.sh etcd kubectl      # only these
#   hack/build-tools.sh kubeadm           # only kind's node image needs it (hack/kind-node-image.sh)
#   hack/build-tools.sh registry          # only the e2e suite's registry needs it (hack/registry.sh)
#   hack/build-tools.sh kuberay kueue     # the GPU cluster's controllers (hack/controllers.sh)
#   hack/build-tools.sh cilium            # the e2e cluster's CNI and NetworkPolicy enforcer
#                                         # (hack/cilium.sh): cilium-agent, cilium-operator-generic,
#                                         # cilium-cni, cilium-dbg, cilium-mount, cilium-sysctlfix
#
# Idempotent: a tool whose binary already reports the pinned version is skipped, so a warm run takes
# seconds. Each tool group is built from a wrapper Go module under $GYMKUBE_CACHE/src/, never in the
# repository. GYMKUBE_BUILD_JOBS (default 2) caps parallel compile jobs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/tools.sh"

KUBE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm)
# Built only when asked for by name: kubeadm goes into kind's node image (hack/kind-node-image.sh),
# the registry into the e2e suite's registry image (hack/registry.sh), KubeRay's and Kueue's
# controllers into their images (hack/controllers.sh), Cilium's binaries into its (hack/cilium.sh).
ON_REQUEST_TOOLS=(kubeadm registry kuberay kueue cilium)
ALL_TOOLS=("${KUBE_TOOLS[@]}" etcd helm kustomize kwok registry kuberay kueue cilium)
DEFAULT_TOOLS=()
for tool in "${ALL_TOOLS[@]}"; do [[ " ${ON_REQUEST_TOOLS[*]} " == *" $tool "* ]] || DEFAULT_TOOLS+=("$tool"); done
JOBS=${GYMKUBE_BUILD_JOBS:-2}
SRC_DIR=$GYMKUBE_CACHE/src
SCRATCH_DIR=$GYMKUBE_CACHE/scratch
# Go's build cache, unless the caller chose GOCACHE: removed once every tool is built, since the
# binaries are what is kept and from empty caches these builds leave about 17 GB there, room the e2e
# cluster needs (the suite asks for the last tools while it readies the cluster).
GO_BUILD_CACHE=$GYMKUBE_CACHE/go-build

log() { printf 'build-tools: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# The line each binary's version output must contain for the current pins.
expected_version() {
	case $1 in
	kubectl) echo "Client Version: $KUBERNETES_VERSION" ;;
	kubeadm) echo "$KUBERNETES_VERSION" ;;
	kube-* | kubelet) echo "Kubernetes $KUBERNETES_VERSION" ;;
	etcd) echo "etcd Version: ${ETCD_VERSION#v}" ;;
	helm) echo "$HELM_VERSION" ;;
	kustomize) echo "$KUSTOMIZE_VERSION" ;;
	kwok) echo "$KWOK_VERSION" ;;
	registry) echo "$DISTRIBUTION_VERSION" ;;
	kuberay) echo "$KUBERAY_VERSION" ;;
	kueue) echo "$KUEUE_VERSION" ;;
	cilium) echo "${CILIUM_VERSION#v}" ;;
	esac
}

reported_version() {
	local bin=$GYMKUBE_BIN_DIR/$1
	case $1 in
	kubectl) "$bin" version --client ;;
	kubeadm) "$bin" version -o short ;;
	kube-* | kubelet | etcd) "$bin" --version ;;
	helm) "$bin" version --template '{{.Version}}' ;;
	kustomize) "$bin" version ;;
	# "kwok version v0.8.0 go1.26.8 (linux/amd64)": the third word is its own version.
	kwok) "$bin" --version | awk '{print $3}' ;;
	# "registry github.com/distribution/distribution/v3 v3.1.2".
	registry) "$bin" --version | awk '{print $3}' ;;
	# Neither prints a version: the wrapped module's, from the binary's build info.
	kuberay) go version -m "$bin" | awk '$2 == "github.com/ray-project/kuberay/ray-operator" {print $3}' ;;
	kueue) go version -m "$bin" | awk '$2 == "sigs.k8s.io/kueue" {print $3}' ;;
	# "cilium-agent 1.15.19 go version ..." (the -X of build_cilium); the others are built with it.
	cilium) "$GYMKUBE_BIN_DIR/cilium-agent" --version | awk '{print $2}' ;;
	esac 2>/dev/null
}

# True when the binary exists and one line of its version output is exactly the expected one.
is_current() {
	local out bin=$1
	[[ $bin == cilium ]] && bin=cilium-agent
	[[ -x $GYMKUBE_BIN_DIR/$bin ]] && out=$(reported_version "$1") &&
		grep -qxF -- "$(expected_version "$1")" <<<"$out"
}

# Path of MODULE@VERSION's go.mod in the module cache (downloads it when missing).
module_gomod() {
	(cd "$SRC_DIR" && go mod download -json "$1") | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p'
}

# Prepares wrapper module DIR whose go.mod starts as stdin, then records the tool packages "$@".
# GODEBUG defaults follow the main module, so callers copy the wrapped module's go and godebug lines.
prepare_wrapper() {
	local dir=$1 base
	shift
	base=$(cat)
	mkdir -p "$dir"
	if [[ -f $dir/go.sum && -f $dir/base.mod && $(<"$dir/base.mod") == "$base" ]]; then
		return
	fi
	printf '%s\n' "$base" >"$dir/go.mod"
	rm -f "$dir/go.sum" "$dir/base.mod"
	(cd "$dir" && go get -tool "$@")
	printf '%s\n' "$base" >"$dir/base.mod"
}

# go.mod header for a wrapper named NAME around the module whose go.mod is GOMOD.
wrapper_header() {
	echo "module gymkube.local/tools/$1"
	grep -E '^(go|godebug) ' "$2"
}

# Builds PACKAGES with LDFLAGS into the bin dir via a scratch dir, so an interrupted build leaves no
# half-written binary behind (only scratch, which the next run clears).
go_build() {
	local dir=$1 ldflags=$2 out=$3
	shift 3
	local scratch
	scratch=$(mktemp -d "$SCRATCH_DIR/build.XXXXXX")
	(cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -p "$JOBS" -trimpath -ldflags "$ldflags" -o "$scratch/$out" "$@")
	mv -f "$scratch"/* "$GYMKUBE_BIN_DIR/"
	rmdir "$scratch"
}

build_kubernetes() {
	local v=$KUBERNETES_VERSION gomod info minor build_date ldflags dir=$SRC_DIR/kubernetes-$KUBERNETES_VERSION
	gomod=$(module_gomod "k8s.io/kubernetes@$v")
	[[ -n $gomod ]] || die "k8s.io/kubernetes@$v is not on the Go module proxy"
	minor=${v#v1.}
	minor=${minor%%.*}
	# k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them onto ./staging; a consumer
	# must map each onto its published v0.<minor>.<patch> tag instead.
	local staging tool_pkgs=("${KUBE_TOOLS[@]/#/k8s.io/kubernetes/cmd/}")
	staging=$(awk '$2 == "v0.0.0" {required[$1] = 1}
		$2 == "=>" && $3 ~ /^\.\/staging\// && ($1 in required) {print $1}' "$gomod")
	{
		wrapper_header kubernetes "$gomod"
		# The tool list is part of the header: adding a tool resolves the wrapper's modules again.
		echo "// tools: ${KUBE_TOOLS[*]}"
		echo "require k8s.io/kubernetes $v"
		echo "replace ("
		for m in $staging; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${v#v1.}"; done
		echo ")"
	} | prepare_wrapper "$dir" "${tool_pkgs[@]/%/@$v}"
	info=$(dirname "$gomod")/$v.info
	build_date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info")
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
	done
	go_build "$dir" "$ldflags" "" "${@/#/k8s.io/kubernetes/cmd/}"
}

# Builds PACKAGE of MODULE@VERSION as bin/OUT with LDFLAGS, through a wrapper module NAME-VERSION
# (a module whose go.mod carries replace lines, as etcd's server does, refuses `go install`; a
# wrapper module does not).
build_wrapped() {
	local name=$1 module=$2 version=$3 package=$4 out=$5 ldflags=$6 gomod dir=$SRC_DIR/$1-$3
	gomod=$(module_gomod "$module@$version")
	[[ -n $gomod ]] || die "$module@$version is not on the Go module proxy"
	wrapper_header "$name" "$gomod" | prepare_wrapper "$dir" "$package@$version"
	go_build "$dir" "$ldflags" "$out" "$package"
}

build_etcd() {
	build_wrapped etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 etcd "-s -w"
}

build_helm() {
	local gomod dir=$SRC_DIR/helm-$HELM_VERSION
	gomod=$(module_gomod "helm.sh/helm/v3@$HELM_VERSION")
	[[ -n $gomod ]] || die "helm.sh/helm/v3@$HELM_VERSION is not on the Go module proxy"
	wrapper_header helm "$gomod" | prepare_wrapper "$dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	# As helm's own Makefile does: the Kubernetes version that `helm template` and `helm lint`
	# assume comes from the client-go helm builds with (v0.Y.Z -> 1.Y); unset, it is 1.20.
	local client_go major minor ldflags
	client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")
	IFS=. read -r major minor _ <<<"${client_go#v}"
	ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		ldflags+=" -X $pkg.k8sVersionMajor=$((major + 1)) -X $pkg.k8sVersionMinor=$minor"
	done
	go_build "$dir" "$ldflags" helm helm.sh/helm/v3/cmd/helm
}

# kustomize reads its version from the build info of the wrapped module; no -X needed.
build_kustomize() {
	build_wrapped kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION" \
		sigs.k8s.io/kustomize/kustomize/v5 kustomize "-s -w"
}

# kwok (fake nodes and pods for bench/scale.py and the scale test); its version is a build-time -X.
build_kwok() {
	build_wrapped kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok kwok \
		"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
}

# The distribution registry; its version is a build-time -X as in its own Makefile.
build_registry() {
	build_wrapped distribution github.com/distribution/distribution/v3 "$DISTRIBUTION_VERSION" \
		github.com/distribution/distribution/v3/cmd/registry registry \
		"-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION"
}

# KubeRay's operator (its main package is the module root); its version is in its build info.
build_kuberay() {
	build_wrapped kuberay github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" \
		github.com/ray-project/kuberay/ray-operator kuberay "-s -w"
}

# Kueue's controller manager; its version is a build-time -X as in its own Makefile.
build_kueue() {
	build_wrapped kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue kueue \
		"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
}

# Cilium in a copy of its module's own source (its go.mod has replace lines a wrapper module would
# have to repeat) with hack/cilium/*.patch applied; its agent's version is a build-time -X as in its
# Makefile.defs. The copy's name carries the patches' hash, so a changed patch gets a fresh copy;
# the binaries are rebuilt from it once removed (their version check does not see patches).
build_cilium() {
	local dir module entry ldflags tags scratch patch
	dir=$SRC_DIR/cilium-$CILIUM_VERSION-$(cat "$GYMKUBE_HACK_DIR"/cilium/*.patch | sha256sum | cut -c1-8)
	if [[ ! -f $dir/go.sum ]]; then
		module=$(go_module_dir "github.com/cilium/cilium@$CILIUM_VERSION")
		[[ -d $module ]] || die "github.com/cilium/cilium@$CILIUM_VERSION is not on the Go module proxy"
		rm -rf "$dir"
		cp -r "$module" "$dir.partial"
		chmod -R u+w "$dir.partial"
		# The module zip keeps vendor/modules.txt alone; without it the build resolves modules.
		rm -rf "$dir.partial/vendor"
		for patch in "$GYMKUBE_HACK_DIR"/cilium/*.patch; do
			(cd "$dir.partial" && git apply "$patch") || die "$patch does not apply to cilium $CILIUM_VERSION"
		done
		mv "$dir.partial" "$dir"
	fi
	ldflags="-s -w -X github.com/cilium/cilium/pkg/version.ciliumVersion=${CILIUM_VERSION#v}"
	scratch=$(mktemp -d "$SCRATCH_DIR/build.XXXXXX")
	for entry in "${CILIUM_BINARIES[@]}"; do
		tags=osusergo
		# The operator for clusters on no cloud (its Makefile's cilium-operator-generic).
		[[ ${entry#*:} == cilium-operator-generic ]] && tags+=,ipam_provider_operator
		(cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -mod=mod -p "$JOBS" -trimpath -tags "$tags" \
			-ldflags "$ldflags" -o "$scratch/${entry#*:}" "./${entry%%:*}")
	done
	mv -f "$scratch"/* "$GYMKUBE_BIN_DIR/"
	rmdir "$scratch"
}

all_current() {
	local tool
	for tool in "$@"; do is_current "$tool" || return 1; done
}

main() {
	local requested=("$@") stale=() stale_kube=() tool
	((${#requested[@]})) || requested=("${DEFAULT_TOOLS[@]}")
	for tool in "${requested[@]}"; do
		[[ " ${ALL_TOOLS[*]} " == *" $tool "* ]] || die "unknown tool '$tool' (known: ${ALL_TOOLS[*]})"
	done
	command -v go >/dev/null || die "Go is required (https://go.dev/doc/install)"
	mkdir -p "$GYMKUBE_BIN_DIR" "$SRC_DIR"
	# Tools already built need no lock: a caller does not wait behind another's build of others
	# (binaries land by rename, so a check never sees half a file).
	if all_current "${requested[@]}"; then
		log "up to date in $GYMKUBE_BIN_DIR"
		return
	fi
	# Several checkouts may run `make test` at once; one builder at a time per cache.
	exec 9>"$GYMKUBE_CACHE/build.lock"
	flock 9
	rm -rf "$SCRATCH_DIR"
	mkdir -p "$SCRATCH_DIR"
	export GOCACHE=${GOCACHE:-$GO_BUILD_CACHE}

	for tool in "${requested[@]}"; do
		is_current "$tool" && continue
		stale+=("$tool")
		[[ " ${KUBE_TOOLS[*]} " == *" $tool "* ]] && stale_kube+=("$tool")
	done
	if ((${#stale[@]} == 0)); then
		log "up to date in $GYMKUBE_BIN_DIR"
		return
	fi
	log "building into $GYMKUBE_BIN_DIR with $JOBS parallel jobs"
	local start=$SECONDS
	if ((${#stale_kube[@]})); then
		log "building ${stale_kube[*]} $KUBERNETES_VERSION (10-15 minutes on 2 cores with cold Go caches)"
		build_kubernetes "${stale_kube[@]}"
	fi
	for tool in etcd helm kustomize kwok registry kuberay kueue cilium; do
		[[ " ${stale[*]} " == *" $tool "* ]] || continue
		local version_var=${tool^^}_VERSION
		[[ $tool == registry ]] && version_var=DISTRIBUTION_VERSION
		log "building $tool ${!version_var}"
		"build_$tool"
	done
	for tool in "${stale[@]}"; do
		is_current "$tool" || die "$tool was built but does not report $(expected_version "$tool")"
	done
	log "built ${stale[*]} in $((SECONDS - start))s"
	if [[ $GOCACHE == "$GO_BUILD_CACHE" ]] && all_current "${ALL_TOOLS[@]}"; then
		log "every tool is built; removing Go's build cache ($GO_BUILD_CACHE)"
		rm -rf "$GO_BUILD_CACHE"
	fi
}

main "$@"
