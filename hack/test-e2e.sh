#!/usr/bin/env bash
# The e2e tier on this machine: the local single-node cluster (started here when it is not up,
# and taken down again afterwards), the images `make images` built loaded into it, then
# tests/e2e. On kind or any other cluster run the suite directly (docs/cluster.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/gymkube/Chart.yaml)
images=()
for component in envserver router operator preflight trainer-cpu; do
	images+=("gymkube/$component:$tag")
done

started_here=false
hack/local-cluster.sh status >/dev/null 2>&1 || started_here=true
stop_started_cluster() { if $started_here; then hack/local-cluster.sh down; fi; }
trap stop_started_cluster EXIT

hack/local-cluster.sh up
hack/local-cluster.sh load-image "${images[@]}"
GYMKUBE_E2E_KUBECONFIG=$(hack/local-cluster.sh kubeconfig) GYMKUBE_E2E_IMAGE_TAG=$tag \
	.venv/bin/python -m pytest -m e2e tests/e2e "$@"
