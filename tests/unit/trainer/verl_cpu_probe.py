"""Runs verl's and vLLM's own code paths that break on a machine without an accelerator, in a
fresh process (verl resolves its platform once per process), and prints what happened as JSON.

    python verl_cpu_probe.py [--unwrap-backend]

With VERL_USE_EXTERNAL_MODULES=gymkube_agentloop.verl_cpu and VERL_PLATFORM=cpu in the
environment, gymkube's fixes are in place; without them, verl's defaults are. --unwrap-backend
takes the backend-string fix back out after the module loaded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import verl  # noqa: F401  (imports the external module, as in every verl process)
from gymkube_dev.ports import free_port


def outcome(check: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": check()}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}


def device() -> dict[str, str]:
    from verl.utils.device import get_device_id, get_device_name

    layer = torch.nn.Linear(2, 2).to(device=get_device_id())
    return {
        "name": get_device_name(),
        "device_string": f"{get_device_name()}:{get_device_id()}",
        "module_device": layer.weight.device.type,
    }


def process_group() -> str:
    from verl.utils.distributed import initialize_global_process_group_ray

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    initialize_global_process_group_ray(timeout_second=30)
    backend = str(torch.distributed.get_backend())
    torch.distributed.destroy_process_group()
    return backend


def vllm_version_check() -> str:
    import verl.third_party.vllm as verl_vllm

    return str(verl_vllm.package_version)


def weights_after_loading() -> dict[str, Any]:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
        backend="gloo",
    )
    with set_current_vllm_config(VllmConfig()):
        initialize_model_parallel(1, 1)
        layer = torch.nn.Module()
        method = UnquantizedLinearMethod()
        method.create_weights(
            layer, 4, [3], 4, 3, torch.float32, weight_loader=lambda p, w: p.data.copy_(w)
        )
        torch.nn.init.normal_(layer.weight)
        weight = layer.weight.detach().clone()
        method.process_weights_after_loading(layer)
        x = torch.randn(2, 4)
        same = torch.allclose(method.apply(layer, x), x @ weight.T, atol=1e-5)
        return {
            "weight_loader": hasattr(layer.weight, "weight_loader"),
            "shape": list(layer.weight.shape),
            "matches_f_linear": bool(same),
        }


def main() -> None:
    if "--unwrap-backend" in sys.argv:
        for name in ("init_process_group", "new_group"):
            wrapped = getattr(torch.distributed, name)
            setattr(torch.distributed, name, getattr(wrapped, "__wrapped__", wrapped))
    results = {
        "device": outcome(device),
        "process_group": outcome(process_group),
        "vllm_version_check": outcome(vllm_version_check),
        "weights_after_loading": outcome(weights_after_loading),
        "torch_threads": outcome(torch.get_num_threads),
    }
    print("PROBE " + json.dumps(results))


if __name__ == "__main__":
    main()
