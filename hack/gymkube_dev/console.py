"""What `make up` and `make down` print: timestamped lines, step headings, subprocesses streamed
indented and waits that print every change, each with a heartbeat while nothing changes."""

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Sequence

from gymkube_dev import REPO
from gymkube_dev.errors import StepError

HEARTBEAT_S = 20.0
"""The longest `make up` stays silent while it waits on something."""
STARTED = time.monotonic()


def clock() -> str:
    seconds = int(time.monotonic() - STARTED)
    return f"{seconds // 60:2d}:{seconds % 60:02d}"


def say(message: str) -> None:
    print(f"[{clock()}] {message}", flush=True)


def step(title: str) -> None:
    print(f"\n[{clock()}] ==> {title}", flush=True)


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_streamed(cmd: Sequence[str], *, what: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs CMD, echoing its output indented, with a heartbeat while it is silent; returns its
    stdout lines. Raises StepError naming WHAT when it fails."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout: list[str] = []
    # Raw reads on the pipes: a buffered readline could sit on lines select() no longer reports.
    pending = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
    selector = selectors.DefaultSelector()
    for fd in pending:
        selector.register(fd, selectors.EVENT_READ)
    last_output = time.monotonic()
    while pending:
        for key, _ in selector.select(timeout=1.0):
            fd = int(key.fd)
            chunk = os.read(fd, 65536)
            lines = (pending[fd] + chunk).split(b"\n")
            if chunk:
                pending[fd] = lines.pop()
            else:
                selector.unregister(fd)
                del pending[fd]
            for raw in filter(None, lines):
                line = raw.decode(errors="replace").rstrip()
                if fd == proc.stdout.fileno():
                    stdout.append(line)
                print(f"    {line}", flush=True)
                last_output = time.monotonic()
        if time.monotonic() - last_output >= HEARTBEAT_S:
            say(f"  ... {what}: still working ({duration(time.monotonic() - started)})")
            last_output = time.monotonic()
    proc.stdout.close()
    proc.stderr.close()
    if proc.wait() != 0:
        raise StepError(f"{what} failed (exit {proc.returncode}); its output is above")
    say(f"  {what}: done in {duration(time.monotonic() - started)}")
    return stdout


def quiet(cmd: Sequence[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs CMD for its answer, printing nothing."""
    return subprocess.run(
        list(cmd), cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def poll(
    what: str,
    check: Callable[[], tuple[bool, str]],
    timeout: float,
    interval: float,
    finished: str = "ready",
) -> None:
    """Prints CHECK's description whenever it changes until CHECK says done; StepError on
    timeout."""
    started, last = time.monotonic(), ""
    last_print = started
    while True:
        done, description = check()
        if description != last or time.monotonic() - last_print >= HEARTBEAT_S:
            say(f"  {what}: {description}")
            last, last_print = description, time.monotonic()
        if done:
            say(f"  {what}: {finished} in {duration(time.monotonic() - started)}")
            return
        if time.monotonic() - started >= timeout:
            raise StepError(f"{what} not {finished} after {duration(timeout)}: {description}")
        time.sleep(interval)
