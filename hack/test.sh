#!/usr/bin/env bash
# `make test`: the Kubernetes tools, `pytest tests` (unit, then integration), then the e2e tier
# (hack/test-e2e.sh).
#
# Readying the e2e cluster (`make images`, the cluster, the images loaded into its node) takes
# minutes, mostly Docker and the disk, while the tools build and pytest mostly wait on their own
# servers and the CPU, so they run side by side; so do the e2e tests that are not heavy, once the
# cluster is ready, and then the push of the images to the e2e registry. The heavy tests (CPU
# trainings, the registry test) start once both are done: run beside pytest, the trainings made
# pytest's timing-bound tests fail on 2 cores. The output of what ran beside pytest goes to
# $BESIDE_LOG and is printed after pytest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BESIDE_LOG=out/e2e/beside-pytest.log
say() { printf 'test: %s\n' "$*" >&2; }

mkdir -p "$(dirname "$BESIDE_LOG")"
beside_pid=
stop() {
	if [[ -n $beside_pid ]] && kill -0 "$beside_pid" 2>/dev/null; then
		# Its own process group (setsid), so make, docker and kind under it go too.
		kill -TERM -- "-$beside_pid" 2>/dev/null || true
		wait "$beside_pid" 2>/dev/null || true
	fi
	hack/test-e2e.sh down
}
trap stop EXIT

say "readying the e2e cluster and running its light tests beside pytest (log: $BESIDE_LOG)"
# shellcheck disable=SC2016 # expanded by the inner bash
setsid bash -c '"$1" --no-print-directory images && hack/test-e2e.sh prepare &&
	echo "test: the e2e cluster was ready after $SECONDS s" && hack/test-e2e.sh run-light &&
	echo "test: the light e2e tests passed after $SECONDS s" && hack/test-e2e.sh push' _ "${MAKE:-make}" \
	>"$BESIDE_LOG" 2>&1 </dev/null &
beside_pid=$!

# The tools pytest runs (the integration tier's control plane, kube-scheduler and kwok for its scale
# tests, helm and kustomize), built (niced) while the images are; the readying builds the rest (the
# kubelet and kube-proxy for the node image, the registry, Cilium, the controllers) after them, one
# builder at a time.
PYTEST_TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm kustomize)
hack/build-tools.sh "${PYTEST_TOOLS[@]}"
# Two workers (tests/conftest.py says what shares one): the tests mostly wait on their own servers.
.venv/bin/python -m pytest -n 2 --durations=20 tests

say "pytest passed; waiting for the e2e cluster and its light tests"
beside_rc=0
wait "$beside_pid" || beside_rc=$?
beside_pid=
cat "$BESIDE_LOG"
if ((beside_rc)); then
	say "error: readying the e2e cluster or its light tests failed (exit $beside_rc; the output is above)"
	exit "$beside_rc"
fi
hack/test-e2e.sh run-heavy
