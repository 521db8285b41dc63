"""Episodes whose env failed, through verl's real v1 trainer path: the transfer-queue worker, the
replay buffer and its refill, padding, rollout correction and GRPO advantages, in-process on CPU
against real FrozenLake env servers that are really killed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray
import transfer_queue as tq  # type: ignore[import-untyped]
from agentloop_harness import EnvServer
from gymkube_agentloop import dataset
from gymkube_agentloop.policies import FrozenLakeShortestPath
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerFast
from verl_trainer_harness import (
    TQ_CONFIG,
    EnvServerAt,
    InProcessRollout,
    SessionLLM,
    Step,
    VerlTrainer,
    active_sessions,
    clear_transfer_queue,
    grpo_advantages,
    tq_worker,
    trainer_config,
    wait_for,
)

pytestmark = pytest.mark.unit

N = 4
# 2x2 lakes: the way to G is one or two moves; three rejected replies end an episode with 0.
LAKE = ("--env-config", '{"size": 2, "max_steps": 3}')
LOOP_LOGGER = "gymkube_agentloop.agent_loop"
# verl's ReplayBuffer metric: groups left without a trajectory, replaced by fresh prompts.
EVICTED_FAILED = "training/rollout_failure/evicted_samples"


def solve(conversation: str) -> str:
    return f"<action>{FrozenLakeShortestPath().act(conversation.rpartition('user')[2])}</action>"


def stall(conversation: str) -> str:
    return "<action>nowhere</action>"


@pytest.fixture(scope="module", autouse=True)
def transfer_queue() -> Iterator[None]:
    """A local Ray (TransferQueue's controller and storage are Ray actors) and TransferQueue."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=128 * 1024**2,
        log_to_driver=False,
    )
    try:
        tq.init(OmegaConf.create(TQ_CONFIG))
        yield
    finally:
        tq.close()
        ray.shutdown()


@pytest.fixture(autouse=True)
def _empty_transfer_queue() -> Iterator[None]:
    yield
    clear_transfer_queue()


@dataclass
class Run:
    """One training run: its pool's server, gymkube-dataset's rows, the scripted model, verl's
    TQ worker (behind the rollout hand-off) and the trainer."""

    server: EnvServer
    rows: list[dict[str, Any]]
    llm: SessionLLM
    rollout: InProcessRollout
    trainer: VerlTrainer
    revived: list[EnvServerAt] = field(default_factory=list)

    async def submit(self) -> None:
        await asyncio.to_thread(self.trainer.submit_batch)

    async def kill_server_at_first_turn(self, held: set[int]) -> None:
        """Once the held trajectories are at their first turn and every other has ended, the
        pool's server dies (SIGKILL); then the model answers."""
        await wait_for(lambda: self.llm.held == held, f"trajectories {held} at their first turn")
        await wait_for(lambda: active_sessions(self.server) == len(held), "other episodes ended")
        self.server.kill()
        self.llm.release()

    async def revive_server(self) -> None:
        """The pool's server comes back where it was, as a restarted pod does."""
        server = EnvServerAt(self.server.port, "frozen_lake", *LAKE)
        self.revived.append(server)
        await asyncio.to_thread(server.wait_ready, 30)

    async def step(self) -> Step:
        await self.rollout.settled()
        return await asyncio.to_thread(self.trainer.train_step)


@pytest.fixture
def start_run(
    start_env_server: Callable[..., EnvServer],
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., Awaitable[Run]]]:
    runs: list[Run] = []

    async def start(
        llm: SessionLLM,
        *,
        prompts: int,
        sync_refill_failed_groups: bool = True,
        trainer_mode: str = "sync",
        own_loop: str | None = None,
    ) -> Run:
        """OWN_LOOP: the agent-loop YAML of a user's loop, which reads the pool's URL from
        FROZEN_LAKE_ENV_BASE (as the operator sets it), in place of gymkube's."""
        server = start_env_server("frozen_lake", *LAKE)
        if own_loop is None:
            yaml = agent_yaml(server.url, "  env_client:\n    retry_deadline_s: 0.5\n")
        else:
            monkeypatch.setenv("FROZEN_LAKE_ENV_BASE", server.url)
            yaml = tmp_path / "own-loop.yaml"
            yaml.write_text(own_loop)
        train = tmp_path / "train.parquet"
        args = ["--env-url", server.url, "--env", "frozen_lake", "--split", "train"]
        await asyncio.to_thread(dataset.main, [*args, "--size", "8", "--out", str(train)])
        config = trainer_config(
            agent_yaml=yaml,
            train_file=train,
            cache_dir=tmp_path / "cache",
            n=N,
            train_batch_size=prompts,
            sync_refill_failed_groups=sync_refill_failed_groups,
            trainer_mode=trainer_mode,
        )
        rollout = InProcessRollout(tq_worker(config, llm, tokenizer), asyncio.get_running_loop())
        trainer = await asyncio.to_thread(VerlTrainer, config, tokenizer, rollout)
        runs.append(Run(server, pq.read_table(train).to_pylist(), llm, rollout, trainer))
        return runs[-1]

    yield start
    for run in runs:
        for server in run.revived:
            server.kill()


OWN_LOOP_YAML = """\
- name: gymkube_env
  _target_: my_loops.FrozenLakeLoop
  max_turns: 3
"""
EXAMPLE_LOOP = Path(__file__).parents[3] / "examples" / "custom-agent-loop"


async def test_a_users_loop_written_for_verl_0_9_0_trains_through_verls_trainer(
    start_run: Callable[..., Awaitable[Run]],
    tokenizer: PreTrainedTokenizerFast,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """examples/custom-agent-loop's loop hands verl outputs without the policy versions verl
    0.9.1's trainer reads (extra_fields min_global_steps, max_global_steps): on kind its run
    failed its first step with a TypeError. gymkube's verl support fills them in."""
    monkeypatch.syspath_prepend(str(EXAMPLE_LOOP))
    run = await start_run(SessionLLM(tokenizer, [solve]), prompts=2, own_loop=OWN_LOOP_YAML)
    await run.submit()
    step = await run.step()

    assert len(step.trained) == 2 * N
    assert all(t.valid_tokens >= 1 for t in step.trained)
    # Every trajectory (verl's padding rows too) carries the version of the step it played in.
    assert {t.policy_versions for t in step.trajectories} == {(1, 1)}
    # The loop's rewards, the env's own (every lake solved), reached the batch.
    assert [t.reward for t in step.trained] == [1.0] * (2 * N)


def exclusions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOOP_LOGGER and "excluded from training" in record.getMessage()
    ]


def assert_trainable(step: Step) -> None:
    """What the actor gets: every trajectory carries model tokens, a real reward and the
    advantage GRPO gives it within its group as the group now stands."""
    for trajectory in step.trained:
        assert trajectory.valid_tokens >= 1
        assert trajectory.extra_fields["env_ending"] == "done"
    for group in step.groups().values():
        expected = grpo_advantages([t.reward for t in group])
        assert [t.advantage for t in group] == pytest.approx(expected, abs=1e-5)
    # verl's own padding rows (to a multiple of the data-parallel and mini-batch sizes) are there
    # and train nothing; rollout correction, the step that failed in issue 25, ran over the batch.
    assert all(t.valid_tokens == 0 and t.advantage == 0 for t in step.trajectories if t.padding)
    assert len(step.trajectories) % 2 == 0
    assert "rollout_corr/kl" in step.metrics


async def test_episodes_whose_server_died_at_their_first_turn_stay_out_of_the_trained_batch(
    start_run: Callable[..., Awaitable[Run]],
    tokenizer: PreTrainedTokenizerFast,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 25: the loop handed verl an episode its env failed at its first turn as a sample
    with no model token and a made-up reward of 0 (and one failed before it with no response at
    all, which verl's transfer-queue worker crashed on). Now such an episode is not in the batch:
    the step trains on the others, with GRPO over each group as it stands."""
    caplog.set_level(logging.WARNING, logger=LOOP_LOGGER)
    llm = SessionLLM(tokenizer, [solve, stall], hold={2, 5})
    run = await start_run(llm, prompts=2)
    await run.submit()
    await run.kill_server_at_first_turn({2, 5})
    step = await run.step()

    assert_trainable(step)
    assert len(step.trained) == 2 * N - 2
    assert len(step.groups()) == 2
    assert sorted({t.extra_fields["env_item_id"] for t in step.trained}) == sorted(
        row["item_id"] for row in run.rows[:2]
    )
    # The two whose server died are absent, not zeros, and the loop said why for each.
    assert 0.0 < sum(t.reward for t in step.trained) < len(step.trained)
    lines = exclusions(caplog)
    assert len(lines) == 2
    assert all("(env_lost)" in line for line in lines)
    assert all(run.server.url in line for line in lines)
    assert EVICTED_FAILED not in step.metrics


async def test_a_failed_episode_is_left_out_of_its_groups_baseline(
    start_run: Callable[..., Awaitable[Run]], tokenizer: PreTrainedTokenizerFast
) -> None:
    # Of the four samples of one prompt two win, one loses, and one's server dies at its turn.
    llm = SessionLLM(tokenizer, [solve, solve, stall, solve], hold={3})
    run = await start_run(llm, prompts=1)
    await run.submit()
    await run.kill_server_at_first_turn({3})
    step = await run.step()

    siblings = sorted(step.trained, key=lambda t: -t.reward)
    assert [t.reward for t in siblings] == [1.0, 1.0, 0.0]
    # GRPO over the three that played: (r - mean) / (std + eps).
    assert [t.advantage for t in siblings] == pytest.approx(
        grpo_advantages([1.0, 1.0, 0.0]), abs=1e-5
    )
    assert siblings[0].advantage == pytest.approx(0.57735, abs=1e-4)
    # Scored as a fake 0 instead, the failed one would have moved every sibling's advantage.
    as_a_zero = grpo_advantages([1.0, 1.0, 0.0, 0.0])[:3]
    assert siblings[0].advantage != pytest.approx(as_a_zero[0], abs=0.1)
    assert siblings[2].advantage != pytest.approx(as_a_zero[2], abs=0.1)


@pytest.mark.parametrize("when", ["before the first turn", "at the first turn"])
async def test_a_batch_whose_env_failed_whole_is_replaced_by_fresh_prompts(
    start_run: Callable[..., Awaitable[Run]],
    tokenizer: PreTrainedTokenizerFast,
    caplog: pytest.LogCaptureFixture,
    when: str,
) -> None:
    """Issue 25's crash: every episode of the step lost its env. verl evicts the groups left
    empty and plays fresh prompts in their place (the old loop's zero-token samples took the step
    down in rollout correction: "response_mask must contain at least one valid token")."""
    caplog.set_level(logging.WARNING, logger=LOOP_LOGGER)
    everyone = set(range(2 * N))
    llm = SessionLLM(
        tokenizer, [solve, stall], hold=everyone if when == "at the first turn" else ()
    )
    run = await start_run(llm, prompts=2)
    if when == "before the first turn":
        run.server.kill()
        await run.submit()
    else:
        await run.submit()
        await run.kill_server_at_first_turn(everyone)
    await run.rollout.settled()
    await run.revive_server()
    step = await run.step()

    # verl evicted both empty groups and refilled them with the dataset's next two prompts.
    assert step.metrics[EVICTED_FAILED] == 2
    assert_trainable(step)
    assert len(step.trained) == 2 * N
    assert sorted({t.extra_fields["env_item_id"] for t in step.trained}) == sorted(
        row["item_id"] for row in run.rows[2:4]
    )
    # Each of the eight failed episodes was excluded, and the loop's log line says why.
    lines = exclusions(caplog)
    failed_items = {str(row["item_id"]) for row in run.rows[:2]}
    assert len(lines) == 2 * N
    for line in lines:
        assert "(env_lost)" in line
        assert run.server.url in line
        assert any(f"episode {item} excluded" in line for item in failed_items)
    # Before the first turn the model was never asked; at it, each failed episode asked once.
    assert len(llm.sessions) == (2 * N if when == "before the first turn" else 4 * N)


async def test_without_sync_refill_verl_stops_the_step_on_a_batch_whose_env_failed(
    start_run: Callable[..., Awaitable[Run]], tokenizer: PreTrainedTokenizerFast
) -> None:
    """Why the operator sets trainer.v1.sampler.sync_refill_failed_groups: without it verl's
    sync replay buffer picks the empty groups and raises."""
    run = await start_run(
        SessionLLM(tokenizer, [solve]), prompts=2, sync_refill_failed_groups=False
    )
    run.server.kill()
    await run.submit()
    await run.rollout.settled()
    with pytest.raises(RuntimeError, match="no materializable trajectories"):
        await asyncio.to_thread(run.trainer.train_step)


async def test_under_verls_async_trainer_a_group_with_a_failed_episode_is_replaced_whole(
    start_run: Callable[..., Awaitable[Run]],
    tokenizer: PreTrainedTokenizerFast,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """verl's async replay buffer (trainer.v1.trainer_mode colocate_async or separate_async)
    evicts every group marked failure, so one excluded episode costs its finished siblings too:
    the group is replaced by a fresh prompt. The sync trainer (the operator's) keeps them."""
    caplog.set_level(logging.WARNING, logger=LOOP_LOGGER)
    llm = SessionLLM(tokenizer, [solve, stall], hold={2})
    run = await start_run(llm, prompts=2, trainer_mode="colocate_async")
    await run.submit()
    await run.kill_server_at_first_turn({2})
    await run.rollout.settled()
    await run.revive_server()
    step = await run.step()

    (line,) = exclusions(caplog)
    failed = next(str(row["item_id"]) for row in run.rows[:2] if f" {row['item_id']} " in line)
    kept = next(str(row["item_id"]) for row in run.rows[:2] if row["item_id"] != failed)
    assert step.metrics[EVICTED_FAILED] == 1
    assert_trainable(step)
    assert len(step.trained) == 2 * N
    # The failed episode's three siblings are gone with it; the next prompt played instead.
    played = sorted(t.extra_fields["env_item_id"] for t in step.trained)
    assert played == sorted([kept] * N + [str(run.rows[2]["item_id"])] * N)


async def test_validation_scores_the_episodes_that_finished(
    start_run: Callable[..., Awaitable[Run]], tokenizer: PreTrainedTokenizerFast
) -> None:
    """verl's validation (one sample per row) over a pool whose server died while half the
    episodes were at their first turn: the excluded ones are not in the score at all."""
    held = {1, 3, 5, 7}
    # Validation plays each row once: arrivals 0, 2, 4, 6 win and the losing four are the held.
    llm = SessionLLM(tokenizer, [solve, stall], hold=held)
    run = await start_run(llm, prompts=2)
    validation = asyncio.create_task(asyncio.to_thread(run.trainer.validate))
    await run.kill_server_at_first_turn(held)
    metrics = await validation

    # Counted as zeros, the four lost episodes would have made it 0.5.
    assert metrics["val-core/frozen_lake/reward/mean@1"] == 1.0


async def test_validation_over_a_pool_that_is_down_stops_in_verl_0_9_1(
    start_run: Callable[..., Awaitable[Run]], tokenizer: PreTrainedTokenizerFast
) -> None:
    """The limit docs/faults.md names: verl 0.9.1's _validate asks TransferQueue for an empty list
    of keys when every episode of a validation batch was excluded, so a validation pass during a
    pool outage stops the run. This fails once verl (or gymkube) handles it; then update the
    docs."""
    run = await start_run(SessionLLM(tokenizer, [solve]), prompts=2)
    run.server.kill()
    with pytest.raises(ValueError, match="empty list as keys"):
        await asyncio.to_thread(run.trainer.validate)
