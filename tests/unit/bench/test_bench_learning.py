"""bench/learning.py's pure parts: the first/last-steps summary, the PNG of the curve with the
evals marked, the evals' scores and their comparison, and the run it renders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from learning import (
    CURVE,
    LEARN_RUN,
    SAVE_HF_MODEL,
    TRAINED_EVAL,
    EnvTotals,
    EvalScore,
    compare,
    eval_paths,
    eval_score,
    learn_spec,
    plot_rewards,
    read_metrics,
    step_record,
    summarize,
)

pytestmark = pytest.mark.unit


def test_the_summary_compares_the_first_and_last_three_steps() -> None:
    summary = summarize([0.1, 0.2, 0.0, 0.3, 0.4, 0.5, 0.6], target=0.25)
    assert summary.first_mean == pytest.approx(0.1)
    assert summary.last_mean == pytest.approx(0.5)
    assert summary.gain == pytest.approx(0.4)
    assert summary.met
    flat = summarize([0.125, 0.06, 0.06, 0.2, 0.125, 0.19, 0.125, 0.13, 0.07, 0.19])
    assert not flat.met
    assert summarize([0.5]).gain == 0.0
    with pytest.raises(ValueError, match="no steps"):
        summarize([])


def test_the_curve_is_a_png_with_one_marker_per_step(tmp_path: Path) -> None:
    out = tmp_path / "img" / "curve.png"
    plot_rewards([0.0, 0.5, 1.0], out, "a run", size=(400, 300))
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (400, 300)
        pixels = image.convert("RGB")
        # Step 1 at reward 0 sits on the plot's bottom-left corner, step 3 at 1 on its top-right.
        assert pixels.getpixel((70, 300 - 60)) != (255, 255, 255)
        assert pixels.getpixel((400 - 20 - 2, 50 + 2)) == CURVE


def test_a_step_record_joins_the_progress_line_and_verls_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"step": 1, "data": {"actor/entropy": 2.98761, "critic/advantages/max": 1.5}}\nnot json\n'
    )
    progress = {"step": 1, "meanReward": 0.25, "stepSeconds": 50.0}
    record = step_record(progress, read_metrics(metrics), 0.25)
    assert record["mean_reward"] == record["env_mean_score"] == 0.25
    assert record["entropy"] == 2.9876
    assert record["advantage_max"] == 1.5
    assert record["grad_norm"] is None
    assert record["step_s"] == 50.0
    assert read_metrics(tmp_path / "missing.jsonl") == {}


def test_the_env_servers_mean_score_is_over_the_episodes_ended_since() -> None:
    before, after = EnvTotals(episodes=16, score=4), EnvTotals(episodes=32, score=10)
    assert after.mean_since(before) == 0.375
    assert before.mean_since(before) is None


def _score(mean: float, interval: tuple[float, float]) -> EvalScore:
    return EvalScore("m", 64, mean, interval, mean, 0, 1.0)


def test_the_trained_eval_is_marked_at_the_last_step_with_its_interval(tmp_path: Path) -> None:
    out = tmp_path / "curve.png"
    evals = (_score(0.1, (0.05, 0.2)), _score(0.9, (0.8, 0.95)))
    plot_rewards([0.0, 0.5, 1.0], out, "a run", size=(400, 300), evals=evals)
    with Image.open(out) as image:
        pixels = image.convert("RGB")
        x = 400 - 20
        plot_h = 300 - 50 - 60
        # The interval bar at the last step, between its bounds (0.8 and 0.95), in its colour.
        assert pixels.getpixel((x, int(50 + (1 - 0.85) * plot_h))) == TRAINED_EVAL


def test_an_eval_score_is_read_from_gymkube_evals_result_line() -> None:
    line = (
        'gymkube-eval-result {"model": "/m", "checkpointStep": 16, "episodes": 64, '
        '"successes": 60, "successRate": 0.9375, "successRateInterval": [0.85, 0.97], '
        '"meanScore": 0.93751, "meanScoreInterval": [0.8771, 0.9979], "meanTurns": 1.1, '
        '"envErrors": 0, "tasks": []}'
    )
    score = eval_score(line, 12.34)
    assert (score.episodes, score.mean_score, score.interval) == (64, 0.9375, (0.8771, 0.9979))
    assert score.seconds == 12.3
    assert compare(_score(0.1, (0, 0.2)), score).met
    assert not compare(_score(0.8, (0.7, 0.9)), score).met


def test_the_run_saves_a_hugging_face_checkpoint_at_its_last_step(tmp_path: Path) -> None:
    spec, steps = learn_spec(LEARN_RUN, seed=3, steps=None)
    assert steps == 16
    assert f"trainer.save_freq={steps}" in spec.overrides
    assert SAVE_HF_MODEL in spec.overrides
    assert "data.seed=3" in spec.overrides
    assert spec.dataset.seed == 3
    short, steps = learn_spec(LEARN_RUN, seed=0, steps=4)
    assert steps == 4
    assert "trainer.save_freq=4" in short.overrides
    paths = eval_paths(tmp_path, "base")
    assert paths.moved("/data/eval.parquet") == f"{tmp_path}/base/data/eval.parquet"
    # The run's checkpoints and models are the training's.
    assert paths.moved("/checkpoints/bench") == f"{tmp_path}/checkpoints/bench"
    assert paths.moved("/models/SmolLM2") == f"{tmp_path}/models/SmolLM2"
