"""How `pytest tests` shares out its tests when it runs on several cores (hack/test.sh runs it as
`pytest -n 2`): each file stays on one worker, so its module fixtures (servers, JVMs) start once;
the integration tier shares one worker and so one private control plane; and the files that start
Ray or vLLM take turns on one worker, since two at once would not fit the memory and cores of a
small machine beside the rest. They go first: they are the longest share.

The e2e suite's tests that are not `solo` run the same way on two workers (hack/test-e2e.sh): the
queued CPU trainings take one worker to themselves, first, while the other runs the rest beside
them (those mostly wait on the cluster)."""

from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Relative to tests/: files whose tests start Ray or a vLLM engine.
RAY_OR_VLLM = {
    "unit/agentloop/test_agentloop_verl_trainer.py",
    "unit/agentloop/test_agentloop_eval.py",
    "unit/trainer/test_weight_sync.py",
}
RAY_OR_VLLM_GROUP = "ray-or-vllm"
CONTROL_PLANE_GROUP = "control-plane"
# Relative to tests/: files that keep a worker to themselves: it runs nothing else.
WORKER_TO_ITSELF = {"e2e/test_e2e_training_mixed.py"}
# The shares that start first.
FIRST = {RAY_OR_VLLM_GROUP, *WORKER_TO_ITSELF}
TESTS = Path(__file__).parent


def _group(relative: str) -> str:
    """The worker share a test file (its path relative to tests/) belongs to."""
    if relative in RAY_OR_VLLM:
        return RAY_OR_VLLM_GROUP
    if relative.startswith("integration/"):
        return CONTROL_PLANE_GROUP
    return relative


class ByFileOrGroup(LoadScopeScheduling):
    """xdist's scope scheduling with the share above as the scope. (xdist's own loadgroup cannot
    be used: with pytest 9.2 the group it writes into a test's node id is lost. Node ids start
    with the file's path from the rootdir: tests/….)"""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return _group(path.removeprefix(f"{TESTS.name}/"))

    def _reschedule(self, node: WorkerController) -> None:
        # A worker given a share that keeps it to itself gets nothing after it: it is told to end
        # (and so runs its last test, which an xdist worker holds back until it knows what follows).
        if WORKER_TO_ITSELF.intersection(self.assigned_work[node]):
            if not node.shutting_down:
                node.shutdown()
            return
        super()._reschedule(node)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    return ByFileOrGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def starts_later(item: pytest.Item) -> bool:
        return _group(item.path.relative_to(TESTS).as_posix()) not in FIRST

    items.sort(key=starts_later)
