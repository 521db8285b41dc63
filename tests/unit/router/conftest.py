"""Fixtures that start real processes and kill them (by PID) afterwards (router_harness)."""

from router_harness import module_procs, procs

__all__ = ["module_procs", "procs"]
