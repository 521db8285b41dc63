#!/usr/bin/env bash
# The e2e tier on this machine: a cluster (started here when none is up, and taken down again
# afterwards), the images `make images` built loaded into it, then tests/e2e.
#
#   hack/test-e2e.sh [PYTEST_ARG...]        prepare, run, down
#   hack/test-e2e.sh prepare                the cluster up and the images loaded
#   hack/test-e2e.sh run [PYTEST_ARG...]    tests/e2e on the cluster prepare readied (with no
#                                           argument: the tests not marked solo on two workers,
#                                           then the solo ones; with some: one plain session)
#   hack/test-e2e.sh down                   that cluster removed, if prepare started it
#
# The phases let `make test` (hack/test.sh) ready the cluster while pytest runs; the state
# between them is $E2E_STATE.
#
# GYMKUBE_E2E_CLUSTER picks the cluster:
#   auto (default)     a kind cluster that is up; else the local cluster when it is up; else kind
#                      when a node image can be had (kind's own where Docker can pull it, else
#                      `hack/kind-node-image.sh` builds one here); else the local single-node
#                      cluster (hack/local-cluster.sh). The same order as `make up`.
#   running            a kind cluster that is up (`make kind-up`), else the local cluster
#   kind | local       that one, or fail
# On any other cluster run the suite directly (docs/cluster.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/kind-common.sh
source hack/lib/kind-common.sh

# The images `make images` built, tagged with the chart's appVersion (gymkube_dev.images).
tag=$(.venv/bin/python -m gymkube_dev.images tag)
refs=$(.venv/bin/python -m gymkube_dev.images refs)
mapfile -t images <<<"$refs"

say() { printf 'test-e2e: %s\n' "$*" >&2; }

choose_cluster() {
	case ${GYMKUBE_E2E_CLUSTER:-auto} in
	kind | local) echo "$GYMKUBE_E2E_CLUSTER" ;;
	running)
		if hack/ensure-docker.sh >/dev/null 2>&1 && kind_cluster_exists; then
			echo kind
		else
			echo local
		fi
		;;
	auto)
		if hack/ensure-docker.sh >/dev/null 2>&1 && kind_cluster_exists; then
			echo kind
		elif hack/local-cluster.sh status >/dev/null 2>&1; then
			echo local
		elif kind_node_image >/dev/null || hack/kind-node-image.sh >/dev/null; then
			echo kind
		else
			say "kind's node image cannot be had or built here; using the local cluster"
			echo local
		fi
		;;
	*)
		say "error: GYMKUBE_E2E_CLUSTER=$GYMKUBE_E2E_CLUSTER (auto, running, kind or local)"
		exit 2
		;;
	esac
}

# cluster=kind|local, started_here=true|false, kubeconfig=PATH, network_policy_enforced=true
# (Cilium is kind's CNI), controllers=true (KubeRay and Kueue installed) and registry=HOST:PORT,
# one per line.
E2E_STATE=out/e2e/cluster.env

state() { sed -n "s/^$1=//p" "$E2E_STATE" 2>/dev/null; }

prepare() {
	local cluster started_here=false kubeconfig builds=
	if [[ ${GYMKUBE_E2E_CLUSTER:-auto} != local ]]; then
		# The Go builds of Cilium, the controllers and the registry (the longest part with cold
		# caches) run beside the node image (which choosing kind builds when there is none) and the
		# cluster; the node's own tools first, so that the node image does not wait behind them.
		# Cold, the cores are busy throughout, so this moves time more than it saves it.
		hack/build-tools.sh "${KIND_NODE_TOOLS[@]}"
		hack/build-tools.sh cilium kuberay kueue registry &
		builds=$!
	fi
	cluster=$(choose_cluster)
	say "cluster: $cluster"
	if [[ $cluster == kind ]]; then
		kind_cluster_exists || started_here=true
	else
		hack/local-cluster.sh status >/dev/null 2>&1 || started_here=true
	fi
	# Written before the cluster comes up, so `down` removes one that a failure left half made.
	mkdir -p "$(dirname "$E2E_STATE")"
	printf 'cluster=%s\nstarted_here=%s\n' "$cluster" "$started_here" >"$E2E_STATE"
	if [[ $cluster == kind ]]; then
		kubeconfig=$(hack/kind-up.sh "${images[@]}")
		wait "$builds"
		# Cilium as kind's CNI, so the pools' NetworkPolicies are enforced as on a user's cluster
		# (first, so the pods that follow get their addresses from it).
		hack/cilium.sh install
		printf 'network_policy_enforced=true\n' >>"$E2E_STATE"
	else
		hack/local-cluster.sh up
		hack/local-cluster.sh load-image "${images[@]}"
		kubeconfig=$(hack/local-cluster.sh kubeconfig)
		[[ -z $builds ]] || wait "$builds"
	fi
	printf 'kubeconfig=%s\n' "$kubeconfig" >>"$E2E_STATE"
	# The GPU cluster's controllers, for the runs that queue in Kueue and train as a RayJob.
	hack/controllers.sh install "$cluster"
	printf 'controllers=true\n' >>"$E2E_STATE"
	# A registry beside it for the test that pulls the images (pushed by `run`).
	hack/registry.sh up "$cluster"
	printf 'registry=%s\n' "$(hack/registry.sh address)" >>"$E2E_STATE"
}

# suite PYTEST_ARG...: pytest on tests/e2e, against the cluster prepare readied.
suite() {
	GYMKUBE_E2E_KUBECONFIG=$(state kubeconfig) GYMKUBE_E2E_IMAGE_TAG=$tag \
		GYMKUBE_E2E_REGISTRY=$(state registry) \
		GYMKUBE_E2E_CONTROLLERS=$(state controllers | grep . || echo false) \
		GYMKUBE_E2E_NETWORK_POLICY_ENFORCED=$(state network_policy_enforced | grep . || echo false) \
		.venv/bin/python -m pytest --durations=0 tests/e2e "$@"
}

run() {
	[[ -n $(state kubeconfig) ]] || { say "error: no cluster is ready for e2e; run \`$0 prepare\` first"; exit 2; }
	# Here, not in prepare: gzip of the pushed layers takes both cores for a minute or more, which
	# made Ray time out starting in a pytest run beside `make test`'s prepare.
	[[ -z $(state registry) ]] || hack/registry.sh push "$(state cluster)"
	if (($#)); then
		suite -m e2e "$@"
		return
	fi
	# Two sessions. First the tests not marked solo, on two workers (tests/conftest.py): the queued
	# CPU trainings keep one to themselves while the rest, which mostly wait on the cluster, run on
	# the other; the chart stays installed for the second session, the solo tests one at a time with
	# nothing beside them. The second runs whatever the first's outcome, so a run reports every
	# failure.
	local failed=0
	GYMKUBE_E2E_KEEP_OPERATOR=true suite -m "e2e and not solo" -n 2 --no-loadscope-reorder ||
		failed=$?
	suite -m "e2e and solo" || failed=$?
	return "$failed"
}

down() {
	if [[ $(state started_here) == true ]]; then
		case $(state cluster) in
		kind) hack/registry.sh down && hack/kind-down.sh ;;
		local) hack/registry.sh down && hack/local-cluster.sh down ;;
		esac
	fi
	rm -f "$E2E_STATE"
}

case ${1:-} in
prepare) prepare ;;
run) shift && run "$@" ;;
down) down ;;
*)
	trap down EXIT
	prepare
	run "$@"
	;;
esac
