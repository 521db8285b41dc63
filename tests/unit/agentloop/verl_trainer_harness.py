"""verl's v1 (transfer-queue) trainer path in-process on CPU, for the agent-loop tests.

What runs is verl's own code: `AgentLoopWorkerTQ` (the class under its `@ray.remote`) spawning
each prompt's sessions and publishing them to TransferQueue, `ReplayBuffer.sample`, and the
`PPOTrainer` methods of a step and of validation (dataloader, prompt submission and refill, batch
balancing and padding, rollout correction, GRPO advantages), borrowed from `PPOTrainer`. What
stands in: a scripted LLM client for vLLM (`SessionLLM`), an in-process hand-off for the Ray call
from `AgentLoopManagerTQ` to its worker (`InProcessRollout`), and, for the actor's log-prob
recompute, the rollout's own log-probs (`VerlTrainer.actor_log_probs`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transfer_queue as tq  # type: ignore[import-untyped]
import verl
from agentloop_harness import BIN, EnvServer, ServerProcess, register_from_yaml
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerFast
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

# Typed loosely: these tests borrow PPOTrainer's methods for a stand-in and reach under @ray.remote.
_PPOTrainer: Any = PPOTrainer
_RemoteWorkerTQ: Any = AgentLoopWorkerTQ
# The config verl's main_ppo composes (ppo_trainer.yaml and its defaults), flattened by verl.
VERL_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
# TransferQueue's controller and each storage unit ask Ray for one CPU: one unit fits 2 CPUs.
TQ_CONFIG = {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}
# What the tests read back of each trajectory in the trained batch.
TRAJECTORY_FIELDS = [
    "uid",
    "session_id",
    "response_mask",
    "rm_scores",
    "advantages",
    "extra_fields",
]


def clear_transfer_queue() -> None:
    """Drop every key (prompts and trajectories) a test left in TransferQueue."""
    for partition_id, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition_id)


class EnvServerAt(ServerProcess):
    """`gymkube-envserver` on a given port: a server that comes back where a dead one was, as a
    restarted pod does behind its stable address."""

    def __init__(self, port: int, env: str, *args: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            [
                str(BIN / "gymkube-envserver"),
                *("--host", "127.0.0.1", "--port", str(port), "--env", env),
                *args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )


def active_sessions(server: EnvServer) -> int:
    with urllib.request.urlopen(server.url + "/status", timeout=5) as reply:
        status: dict[str, Any] = json.load(reply)
    return int(status["active"])


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        await asyncio.sleep(0.02)


class SessionLLM:
    """Stands in for verl's LLM server client, one script per trajectory.

    The k-th trajectory to ask (told apart by verl's per-trajectory request id) plays
    `scripts[k % len(scripts)]`, a function of the conversation so far. A trajectory whose k is in
    `hold` waits at its first turn until `release()`: the model is still thinking when the test
    breaks its env.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        scripts: list[Callable[[str], str]],
        hold: Iterable[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.hold = frozenset(hold)
        self.sessions: dict[str, int] = {}
        self.held: set[int] = set()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        first_turn = request_id not in self.sessions
        index = self.sessions.setdefault(request_id, len(self.sessions))
        if first_turn and index in self.hold:
            self.held.add(index)
            await self._released.wait()
        conversation = str(self.tokenizer.decode(prompt_ids))
        text = self.scripts[index % len(self.scripts)](conversation)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0)


def trainer_config(
    *,
    agent_yaml: Path,
    train_file: Path,
    cache_dir: Path,
    n: int,
    train_batch_size: int,
    sync_refill_failed_groups: bool,
    trainer_mode: str = "sync",
    response_length: int = 512,
    prompt_length: int = 1024,
) -> DictConfig:
    """verl's default trainer config with a gymkube GRPO run's settings."""
    config = OmegaConf.load(VERL_CONFIG)
    assert isinstance(config, DictConfig)
    settings: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": True,
        "actor_rollout_ref.rollout.n": n,
        "actor_rollout_ref.rollout.prompt_length": prompt_length,
        "actor_rollout_ref.rollout.response_length": response_length,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(agent_yaml),
        "actor_rollout_ref.actor.ppo_mini_batch_size": train_batch_size,
        "data.train_files": [str(train_file)],
        "data.val_files": [str(train_file)],
        "data.train_batch_size": train_batch_size,
        "data.max_prompt_length": prompt_length,
        "data.max_response_length": response_length,
        # As the operator renders every run: loops get the row's opening messages.
        "data.return_raw_chat": True,
        "data.dataloader_num_workers": 0,
        "data.shuffle": False,
        "data.cache_dir": str(cache_dir),
        "trainer.v1.trainer_mode": trainer_mode,
        "trainer.v1.sampler.sync_refill_failed_groups": sync_refill_failed_groups,
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
    }
    for key, value in settings.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def tq_worker(config: DictConfig, llm: Any, tokenizer: PreTrainedTokenizerFast) -> Any:
    """verl's AgentLoopWorkerTQ with the attributes its __init__ would set on a CPU-only,
    text-only, vLLM-less worker (no reward-loop workers, no teacher, no tools)."""
    # The class a Ray worker instantiates: Ray's subclass, with its own copies of the methods.
    worker_cls = _RemoteWorkerTQ.__ray_metadata__.modified_class
    worker = worker_cls.__new__(worker_cls)
    worker.config = config
    worker.llm_client = llm
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.dataset_cls = RLHFDataset
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = None
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = []
    worker.background_tasks = set()
    # What the worker's __init__ does with rollout.agent.agent_loop_config_path.
    register_from_yaml(Path(config.actor_rollout_ref.rollout.agent.agent_loop_config_path))
    return worker


class InProcessRollout:
    """Stands in for AgentLoopManagerTQ with one worker: `generate_sequences` hands the batch to
    the worker's own `generate_sequences` on the test's event loop, and returns once the worker
    has spawned the prompts' sessions, as the manager's `ray.get` on the actor call does."""

    def __init__(self, worker: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.worker = worker
        self.loop = loop

    def generate_sequences(self, prompts: Any) -> None:
        asyncio.run_coroutine_threadsafe(
            self.worker.generate_sequences(prompts), self.loop
        ).result()

    async def settled(self) -> None:
        """Wait until every prompt handed over has published its sessions' outcome."""
        while self.worker.background_tasks:
            await asyncio.gather(*list(self.worker.background_tasks))


class _DataParallelRanks:
    """What `_balance_batch` asks of the actor's worker group: its data-parallel layout."""

    def __init__(self, dp_size: int) -> None:
        self._dispatch_info = {"actor": list(range(dp_size))}


class _StreamingRewardWorkers:
    """The trainer's reward-loop manager as a run with reward workers has it: scores come with
    the trajectories (the loop sets them), so no colocated reward pass runs after sampling."""

    def __init__(self) -> None:
        self.reward_loop_worker_handles: list[Any] = []


@dataclass(frozen=True)
class Trajectory:
    """One row of the trained batch, read back from TransferQueue after the advantage step."""

    key: str
    uid: str
    session_id: int
    padding: bool
    valid_tokens: int
    reward: float
    advantage: float
    extra_fields: dict[str, Any]
    # The policy versions verl's step metrics read from the trajectory's tag, as integers.
    policy_versions: tuple[int, int]


@dataclass(frozen=True)
class Step:
    trajectories: list[Trajectory]
    metrics: dict[str, Any]

    @property
    def trained(self) -> list[Trajectory]:
        return [t for t in self.trajectories if not t.padding]

    def groups(self) -> dict[str, list[Trajectory]]:
        by_uid: dict[str, list[Trajectory]] = {}
        for trajectory in self.trained:
            by_uid.setdefault(trajectory.uid, []).append(trajectory)
        return by_uid


class VerlTrainer:
    """verl's v1 PPOTrainer steps on a stand-in without GPU workers: the methods are PPOTrainer's
    own, so the dataloader, prompt submission, replay buffer (with its refill), padding, rollout
    correction, GRPO advantages and validation are verl's code. Its blocking methods run off the
    event loop (`asyncio.to_thread`), as the trainer runs apart from its rollout workers."""

    _init_dataloader = _PPOTrainer._init_dataloader
    _build_replay_buffer = _PPOTrainer._build_replay_buffer
    _resolve_filter_groups_metric = _PPOTrainer._resolve_filter_groups_metric
    _fetch_one_gen_batch = _PPOTrainer._fetch_one_gen_batch
    _next_train_batch = _PPOTrainer._next_train_batch
    _submit_batch_to_rollout = _PPOTrainer._submit_batch_to_rollout
    _add_prompts_to_generate = _PPOTrainer._add_prompts_to_generate
    _add_batch_to_generate = _PPOTrainer._add_batch_to_generate
    _get_required_batch_multiple = _PPOTrainer._get_required_batch_multiple
    _balance_batch = _PPOTrainer._balance_batch
    _compute_advantage = _PPOTrainer._compute_advantage
    _validate = _PPOTrainer._validate
    _maybe_log_val_generations = _PPOTrainer._maybe_log_val_generations
    _val_metrics_update = _PPOTrainer._val_metrics_update

    def __init__(
        self,
        config: DictConfig,
        tokenizer: PreTrainedTokenizerFast,
        rollout: InProcessRollout,
        dp_size: int = 2,
    ) -> None:
        self.config = config
        self.trainer_mode = config.trainer.v1.trainer_mode
        self.tokenizer = tokenizer
        self.processor = None
        self.use_critic = False
        self.global_steps = 1
        self.parameter_sync_step = 1
        self.agent_loop_manager = rollout
        self.actor_rollout_wg = _DataParallelRanks(dp_size)
        self.reward_loop_manager = _StreamingRewardWorkers()
        self._init_dataloader()
        self.replay_buffer = self._build_replay_buffer()
        # verl polls TransferQueue every 2 s while groups run; these episodes take milliseconds.
        self.replay_buffer.poll_interval = 0.05

    def validate(self) -> dict[str, Any]:
        """verl's validation pass: the val rows once each, scored as verl logs them."""
        metrics: dict[str, Any] = self._validate()
        return metrics

    def submit_batch(self) -> None:
        """Step start: one training batch of prompts from the dataloader to the rollout."""
        self._add_batch_to_generate()

    def actor_log_probs(self, batch: Any) -> None:
        """Stands in for the actor's log-prob recompute (`_compute_old_log_prob`): on the
        weights that generated the batch it equals the rollout's own log-probs."""
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["rollout_log_probs"]
        )
        data["old_log_probs"] = data.pop("rollout_log_probs")
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data)

    def train_step(self) -> Step:
        """The rollout half of verl's `_step_once`: sample, balance (and pad), log-probs,
        advantages (with rollout correction); then the trained batch as the actor would get it."""
        metrics: dict[str, Any] = {}
        batch, sample_metrics = self.replay_buffer.sample(
            global_steps=self.global_steps,
            partition_id="train",
            batch_size=self.config.data.train_batch_size,
        )
        metrics.update(sample_metrics)
        batch = self._balance_batch(batch, metrics=metrics)
        self.actor_log_probs(batch)
        batch = self._compute_advantage(batch, metrics=metrics)
        step = Step(read_trajectories(batch), metrics)
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
        self.global_steps += 1
        return step


def read_trajectories(batch: Any) -> list[Trajectory]:
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=TRAJECTORY_FIELDS
    )
    masks = data["response_mask"].unbind()
    scores = data["rm_scores"].unbind()
    advantages = data["advantages"].unbind()
    uids, sessions, extras = (list(data[field]) for field in ("uid", "session_id", "extra_fields"))
    rows = []
    for i, key in enumerate(batch.keys):
        mask: torch.Tensor = masks[i]
        valid = mask.nonzero()
        first = int(valid[0]) if len(valid) else 0
        rows.append(
            Trajectory(
                key=key,
                uid=str(uids[i]),
                session_id=int(sessions[i]),
                padding=bool(batch.tags[i].get("is_padding", False)),
                valid_tokens=int(mask.sum()),
                reward=float(scores[i].sum()),
                advantage=float(advantages[i][first]),
                extra_fields=dict(extras[i]),
                policy_versions=_policy_versions(batch.tags[i]),
            )
        )
    return rows


def _policy_versions(tag: dict[str, Any]) -> tuple[int, int]:
    """What verl's `_compute_metrics` makes of a tag's versions (np.array(..., dtype=int)): a
    None there is the TypeError that fails the step."""
    low, high = np.array([tag["min_global_steps"], tag["max_global_steps"]], dtype=int).tolist()
    return low, high


def grpo_advantages(rewards: list[float], epsilon: float = 1e-6) -> list[float]:
    """GRPO's outcome advantages over one group, worked out here: (r - mean) / (std + eps), with
    the sample standard deviation; a group of one keeps its reward (mean 0, std 1), as verl's."""
    if len(rewards) == 1:
        return list(rewards)
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    return [(r - mean) / (std + epsilon) for r in rewards]
