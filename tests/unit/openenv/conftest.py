"""Real env-server and router processes (the router tests' harness), killed by PID afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))

from router_harness import procs

__all__ = ["procs"]
