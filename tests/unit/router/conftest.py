"""Fixtures that start real processes and kill them (by PID) afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from router_harness import Procs


@pytest.fixture
def procs() -> Iterator[Procs]:
    started = Procs()
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def module_procs() -> Iterator[Procs]:
    started = Procs()
    try:
        yield started
    finally:
        started.stop_all()
