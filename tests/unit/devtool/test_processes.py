"""Stopping a started process: politely first, by force when it does not listen."""

import subprocess
import sys

import pytest
from gymkube_dev.processes import stop

pytestmark = pytest.mark.unit

IGNORES_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def test_a_process_that_exits_on_sigterm_is_reaped() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop(process)
    assert process.returncode == -15


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    process = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"ready"
    stop(process, timeout=0.5)
    assert process.returncode == -9
