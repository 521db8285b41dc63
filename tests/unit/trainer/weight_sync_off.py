"""A verl external module that turns the weight sync into vLLM into a no-op: the sensitivity check
of test_weight_sync.py, never loaded by a real run.

    VERL_USE_EXTERNAL_MODULES=gymkube_agentloop.verl_cpu,weight_sync_off  (with this directory on
    PYTHONPATH)

verl imports it in every process it starts. Where verl's colocated vLLM rollout is loaded (the
actor worker), `ServerAdapter.update_weights`, which streams the actor's tensors to the vLLM
server after each step, returns at once: vLLM keeps the weights it loaded from disk, as it would
if the sync silently did nothing. The patch is applied when verl imports the module, not here,
since verl's own import is not finished while this runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ROLLOUT_MODULE = "verl.workers.rollout.vllm_rollout.vllm_rollout"


# Printed (in the actor worker, so Ray passes it on to the trainer's output) at every skipped sync.
SKIPPED = "weight_sync_off: skipped the weight sync into vLLM"


async def skip_update_weights(*_: Any, global_steps: int | None = None, **__: Any) -> None:
    print(f"{SKIPPED} (global step {global_steps})", flush=True)


def disable(module: ModuleType) -> None:
    module.ServerAdapter.update_weights = skip_update_weights


class DisableOnImport(importlib.abc.MetaPathFinder):
    """Finds verl's vLLM rollout module with the other finders and patches it once executed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != ROLLOUT_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: importlib.machinery.ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            disable(module)

        loader.exec_module = exec_module
        return spec


if ROLLOUT_MODULE in sys.modules:
    disable(sys.modules[ROLLOUT_MODULE])
elif not any(isinstance(finder, DisableOnImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, DisableOnImport())
