#!/usr/bin/env bash
# `make test`: the Kubernetes tools, `pytest tests` (unit, then integration), then the e2e tier
# (hack/test-e2e.sh).
#
# Readying the e2e cluster (`make images`, the cluster, the images loaded into its node) takes
# minutes, mostly Docker and the disk, while the tools build and pytest mostly wait on their own
# servers and the CPU, so they run side by side; the e2e suite starts once both are done (run
# beside pytest, its cluster and trainings made pytest's timing-bound tests fail on 2 cores).
# The readying's output goes to $PREPARE_LOG and is printed after pytest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PREPARE_LOG=out/e2e/prepare.log
say() { printf 'test: %s\n' "$*" >&2; }

mkdir -p "$(dirname "$PREPARE_LOG")"
prepare_pid=
stop() {
	if [[ -n $prepare_pid ]] && kill -0 "$prepare_pid" 2>/dev/null; then
		# Its own process group (setsid), so make, docker and kind under it go too.
		kill -TERM -- "-$prepare_pid" 2>/dev/null || true
		wait "$prepare_pid" 2>/dev/null || true
	fi
	hack/test-e2e.sh down
}
trap stop EXIT

# What the e2e suite writes while it runs (the kind node's copies of the images, the registry's,
# the pods, Ray's spill), on top of the caches (hack/build-tools.sh removes Go's build cache before).
E2E_DISK_GB=35
# Docker may not run yet (the readying starts it): then its default data root, or the nearest
# folder above it that exists.
docker_root=$(timeout 10 docker info --format '{{.DockerRootDir}}' 2>/dev/null || true)
docker_root=${docker_root:-/var/lib/docker}
while [[ ! -d $docker_root ]]; do docker_root=$(dirname "$docker_root"); done
free_gb=$(df -P -BG "$docker_root" | awk 'NR == 2 {print int($4)}')
if ((${free_gb:-0} < E2E_DISK_GB)); then
	say "warning: ${free_gb} GB of disk free where Docker keeps its data; the e2e suite needs about ${E2E_DISK_GB} GB, and a full disk shows up as trainers failing in Ray"
fi
say "readying the e2e cluster beside pytest (log: $PREPARE_LOG)"
# shellcheck disable=SC2016 # expanded by the inner bash
setsid bash -c '"$1" --no-print-directory images && hack/test-e2e.sh prepare &&
	echo "test: the e2e cluster was ready after $SECONDS s"' _ "${MAKE:-make}" \
	>"$PREPARE_LOG" 2>&1 </dev/null &
prepare_pid=$!

# The tools pytest runs (the integration tier's control plane, kube-scheduler and kwok for its scale
# tests, helm and kustomize), built (niced) while the images are; the readying builds the rest (the
# kubelet and kube-proxy for the node image, the registry, Cilium, the controllers) after them, one
# builder at a time.
PYTEST_TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm kustomize)
hack/build-tools.sh "${PYTEST_TOOLS[@]}"
# Two workers (tests/conftest.py says what shares one): the tests mostly wait on their own servers.
.venv/bin/python -m pytest -n 2 --durations=20 tests

say "pytest passed; waiting for the e2e cluster"
prepare_rc=0
wait "$prepare_pid" || prepare_rc=$?
prepare_pid=
cat "$PREPARE_LOG"
if ((prepare_rc)); then
	say "error: readying the e2e cluster failed (exit $prepare_rc; its output is above)"
	exit "$prepare_rc"
fi
hack/test-e2e.sh run
