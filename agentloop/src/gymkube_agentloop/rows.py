"""The dataset row format: what `gymkube-dataset` writes and the `gymkube_env` agent loop reads.

A row names its task by `item_id`, `<env>_<data_idx>`; verl routes it to the loop by `agent_name`.
"""

from __future__ import annotations

AGENT_NAME = "gymkube_env"


def item_id(env: str, data_idx: int) -> str:
    return f"{env}_{data_idx}"


def parse_item_id(text: str) -> tuple[str, int]:
    """(env, data_idx) of an item_id; ValueError naming the expected shape otherwise."""
    env, _, idx_text = text.rpartition("_")
    if not env or not idx_text.lstrip("-").isdigit():
        raise ValueError(f"item_id must look like <env>_<data_idx>, got {text!r}")
    return env, int(idx_text)
