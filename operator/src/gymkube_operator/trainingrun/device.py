"""What `spec.device` changes in a TrainingRun's trainer: one named set of differences.

A gpu run is verl as it comes, with nvidia.com/gpu x gpusPerNode per pod. A cpu run is the same
rendered command with no GPU: gymkube's CPU support for verl (gymkube_agentloop.verl_cpu, loaded
through verl's plugin hook) and the settings below, nothing else; on several nodes (a RayJob) each
node is one made-up GPU of the Ray cluster KubeRay starts. Pure data and functions, so the
difference is tested without a cluster (and the overrides against verl 0.9.1's own Hydra config).
"""

from gymkube_operator.objects import Object
from gymkube_operator.trainingrun.models import Device, TrainingRunSpec

GPU_RESOURCE = "nvidia.com/gpu"

# The trainer container's environment on CPU (the dataset steps need none of it).
CPU_ENV: dict[str, str] = {
    # verl imports this module in every process it starts: it registers the cpu platform...
    "VERL_USE_EXTERNAL_MODULES": "gymkube_agentloop.verl_cpu",
    # ...which this selects (verl falls back to nvidia when no accelerator is found).
    "VERL_PLATFORM": "cpu",
    # verl registers its FSDP engine for cuda and npu only; picked so, it runs on the cpu platform.
    "VERL_ENGINE_DEVICE": "cuda",
    # vLLM's CPU KV cache in GiB: its default (4) is most of a small pod's memory.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # torch.compile on CPU compiles C++ per shape for minutes; eager is enough for small models.
    "TORCH_COMPILE_DISABLE": "1",
    # The model is a local directory (the CPU trainer image ships one): no hub lookups.
    "HF_HUB_OFFLINE": "1",
    # Ray's memory monitor kills workers above 95% of the pod's memory limit counting the page
    # cache (model files, torch's libraries), which the kernel would reclaim; a real shortage
    # still ends in the kernel's OOM kill, which the run reports as TrainerOutOfMemory.
    "RAY_memory_monitor_refresh_ms": "0",
}

# verl makes its resource pools with use_gpu=True: each node is one made-up GPU of Ray's (Ray finds
# none, and verl's pools would never fit), with logical CPUs for Ray's scheduling, so that verl's
# actors fit however few cores the pod has.
MADE_UP_GPUS = 1
LOGICAL_CPUS = 16

# Hydra overrides on CPU, after gymkube's own (replacing any of its keys) and before the user's.
CPU_OVERRIDES: tuple[str, ...] = (
    # Tensors and process groups on the CPU.
    "trainer.device=cpu",
    # One worker per node, on the node's made-up GPU.
    f"trainer.n_gpus_per_node={MADE_UP_GPUS}",
    # verl's default attention, flash_attention_2, is CUDA-only.
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    # The actor engine that trained on CPU.
    "actor_rollout_ref.actor.strategy=fsdp2",
    # Removing padding relies on flash-attention's varlen kernels.
    "actor_rollout_ref.model.use_remove_padding=false",
    # No CUDA graphs on CPU.
    "actor_rollout_ref.rollout.enforce_eager=true",
    # Freeing vLLM's cache between steps needs sleep mode, which is off (next).
    "actor_rollout_ref.rollout.free_cache_engine=false",
    # vLLM's sleep mode is built on CUDA memory pools.
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    # vLLM loads the model's weights from disk, not verl's dummy ones until the first sync.
    "actor_rollout_ref.rollout.load_format=auto",
    # No torch.compile in the actor or the reference model (as TORCH_COMPILE_DISABLE).
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.ref.use_torch_compile=false",
    # The weight sync's /dev/shm bucket: verl's 2048 MB overfills a small pod's shm, and the largest
    # tensor (SmolLM2's embedding, 113 MB float32) must fit in one.
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256",
    # One reward worker and one agent-loop worker: each is a process and memory on a small pod.
    "reward.num_workers=1",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    # verl's transfer queue keeps 8 storage processes (0.4 GB each) by default; one holds a CPU
    # run's few samples, and the 3 GB the others take is most of an OOM kill at a 14Gi limit.
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    # One made-up GPU: no tensor parallelism (verl's default is 2).
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
)


def override_key(override: str) -> str:
    """The config key a Hydra override sets: `+a.b=1`, `a.b=1` and `~a.b` all set a.b."""
    return override.split("=", 1)[0].lstrip("+~")


# On one node verl's driver starts Ray itself, so the made-up resources are its ray.init's. On
# several, KubeRay has started Ray on every node (ray_start_params) and verl only connects, which
# takes no resources.
ONE_NODE_CPU_OVERRIDES: tuple[str, ...] = (
    f"+ray_kwargs.ray_init.num_gpus={MADE_UP_GPUS}",
    f"ray_kwargs.ray_init.num_cpus={LOGICAL_CPUS}",
)


def overrides(spec: TrainingRunSpec) -> list[str]:
    if spec.device != "cpu":
        return []
    return list(CPU_OVERRIDES) + (list(ONE_NODE_CPU_OVERRIDES) if spec.nodes == 1 else [])


def ray_start_params(device: Device) -> dict[str, str]:
    """`ray start` flags KubeRay adds on every node of a RayJob: on CPU, the made-up GPU."""
    if device != "cpu":
        return {}
    return {"num-gpus": str(MADE_UP_GPUS), "num-cpus": str(LOGICAL_CPUS)}


def env(device: Device) -> list[Object]:
    """Environment variables of the trainer container for this device."""
    if device != "cpu":
        return []
    return [{"name": name, "value": value} for name, value in CPU_ENV.items()]


def limits(spec: TrainingRunSpec) -> Object:
    """The trainer container's extra resource limits: its GPUs, none on CPU."""
    return {GPU_RESOURCE: spec.gpus_per_node} if spec.device == "gpu" else {}


def describe(spec: TrainingRunSpec) -> str:
    """What the run trains on, in words for conditions and Events."""
    return "on CPU" if spec.device == "cpu" else f"{spec.nodes} x {spec.gpus_per_node} GPUs"
