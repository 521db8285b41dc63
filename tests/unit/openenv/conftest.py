"""Real env-server and router processes (the router tests' harness), killed by PID afterwards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))

from router_harness import Procs


@pytest.fixture
def procs() -> Iterator[Procs]:
    started = Procs()
    try:
        yield started
    finally:
        started.stop_all()
