"""Stopping the processes that tests and benchmarks start."""

import subprocess
from typing import Any


def stop(process: "subprocess.Popen[Any]", timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if PROCESS has not exited within TIMEOUT seconds; reaps it."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
