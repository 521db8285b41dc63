"""Run the built images with `docker run` the way a pod runs them and play real episodes.

    .venv/bin/python hack/smoke_images.py [--tag TAG] [--prefix PREFIX]

The defaults match hack/build-images.sh: GYMKUBE_IMAGE_PREFIX (gymkube) and GYMKUBE_IMAGE_TAG (the
chart's appVersion).

Containers run as in the operator's pods: non-root (the image's UID), read-only root filesystem,
every capability dropped, no privilege escalation, HOME and TMPDIR on a tmpfs /tmp. Checks:

- envserver (frozen_lake): a whole episode over the wire protocol;
- router in front of that env server: a whole episode through the router;
- envserver (sciworld, a JVM in the container): create, reset, step, close;
- operator, preflight: the entry points start and answer --help / bad settings with a clear error;
- trainer-cpu: gymkube-train accepts the model the image ships, and verl starts on gymkube's CPU
  platform with the pinned verl and vLLM.

Prints one JSON line per check (with seconds) and exits non-zero on the first failure. Only the
containers and the network it creates are removed, by id.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gymkube_dev.images import IMAGES, PREFIX, app_version, image_ref

POD_LIKE = [
    "--read-only",
    "--tmpfs=/tmp:rw,exec,size=512m",
    "--env=HOME=/tmp",
    "--env=TMPDIR=/tmp",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
]
READY_TIMEOUT_S = 180.0
FROZEN_LAKE_MOVES = ["right", "down", "right", "down", "left", "up"]


class SmokeError(Exception):
    """A check failed; the message says which and why."""


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SmokeError(f"docker {' '.join(args[:2])}: {done.stderr.strip()}")
    return done.stdout.strip()


def call(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raise SmokeError(f"{method} {path}: {error.code} {error.read().decode()[:300]}") from None


def wait_ready(base: str, container: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        state = docker("inspect", "--format", "{{.State.Status}}", container)
        if state != "running":
            raise SmokeError(f"container exited ({state}); logs:\n{docker('logs', container)}")
        time.sleep(0.5)
    raise SmokeError(f"{base}/readyz not ready after {READY_TIMEOUT_S:.0f}s")


@contextmanager
def running(image: str, network: str, name: str, *args: str, port: int) -> Iterator[str]:
    """Start a container publishing `port` on 127.0.0.1; yield its base URL; remove it after."""
    container = docker(
        "run", "--detach", f"--network={network}", f"--network-alias={name}",
        f"--publish=127.0.0.1::{port}", *POD_LIKE, image, *args,
    )  # fmt: skip
    try:
        host_port = docker("port", container, f"{port}/tcp").splitlines()[0].rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{host_port}"
        wait_ready(base, container)
        yield base
    except SmokeError as error:
        raise SmokeError(f"{image} {' '.join(args)}: {error}") from None
    finally:
        subprocess.run(["docker", "rm", "--force", container], capture_output=True, check=False)


def frozen_lake_episode(base: str) -> dict[str, Any]:
    session = call(base, "POST", "/create")["id"]
    reset = call(base, "POST", "/reset", {"id": session, "data_idx": 3})
    if not reset["observation"]:
        raise SmokeError("frozen_lake reset gave an empty observation")
    steps, step = 0, {"done": False}
    while not step["done"]:
        move = FROZEN_LAKE_MOVES[steps % len(FROZEN_LAKE_MOVES)]
        step = call(base, "POST", "/step", {"id": session, "action": f"<action>{move}</action>"})
        steps += 1
        if steps > 1_000:
            raise SmokeError("frozen_lake episode never ended")
    call(base, "POST", "/close", {"id": session})
    call(base, "POST", "/close", {"id": session})  # closing twice is not an error
    return {"steps": steps, "score": step["score"]}


def sciworld_episode(base: str) -> dict[str, Any]:
    tasks = call(base, "GET", "/tasks")
    session = call(base, "POST", "/create")["id"]
    reset = call(base, "POST", "/reset", {"id": session, "data_idx": 0})
    step = call(base, "POST", "/step", {"id": session, "action": "look around"})
    if "task_description" not in reset or not step["observation"]:
        raise SmokeError(f"sciworld answered without an observation: {step}")
    call(base, "POST", "/close", {"id": session})
    return {"tasks": tasks["count"], "observation": step["observation"][:60]}


CPU_MODEL = "/models/SmolLM2-135M-Instruct"
CPU_PLATFORM_CHECK = (
    "import os; os.environ.update(VERL_USE_EXTERNAL_MODULES='gymkube_agentloop.verl_cpu', "
    "VERL_PLATFORM='cpu'); import verl, verl.third_party.vllm as v; "
    "from verl.utils.device import get_device_name; "
    "print(get_device_name(), 'verl', verl.__version__, 'vllm', v.package_version)"
)


def entry_point_answers(image: str, *args: str, expect: str) -> dict[str, Any]:
    done = subprocess.run(
        ["docker", "run", "--rm", *POD_LIKE, image, *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if expect not in output:
        raise SmokeError(f"{image} {' '.join(args)}: expected {expect!r}, got:\n{output[-800:]}")
    return {"exit_code": done.returncode}


def report(check: str, started: float, **details: Any) -> None:
    seconds = round(time.monotonic() - started, 1)
    print(json.dumps({"check": check, "seconds": seconds, **details}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prefix", default=os.environ.get("GYMKUBE_IMAGE_PREFIX", PREFIX))
    parser.add_argument("--tag", default=os.environ.get("GYMKUBE_IMAGE_TAG") or app_version())
    options = parser.parse_args()
    image = {name: image_ref(name, options.tag, options.prefix) for name in IMAGES}
    network = docker("network", "create", f"gymkube-smoke-{uuid.uuid4().hex[:8]}")
    try:
        started = time.monotonic()
        with running(image["envserver"], network, "envserver", "--env", "frozen_lake",
                     "--port", "8000", port=8000) as envserver:  # fmt: skip
            report("envserver frozen_lake episode", started, **frozen_lake_episode(envserver))
            started = time.monotonic()
            with running(image["router"], network, "router", "--port", "8080",
                         "--backends", "envserver:8000", port=8080) as router:  # fmt: skip
                report("router frozen_lake episode", started, **frozen_lake_episode(router))
        started = time.monotonic()
        with running(image["envserver"], network, "sciworld", "--env", "sciworld",
                     "--warm", "1", "--max-sessions", "2", port=8000) as sciworld:  # fmt: skip
            report("envserver sciworld episode", started, **sciworld_episode(sciworld))
        started = time.monotonic()
        # No service-account token and no kubeconfig: the operator must say so and exit.
        answer = entry_point_answers(image["operator"], expect="no service-account token")
        report("operator entry point", started, **answer)
        started = time.monotonic()
        report("preflight entry point", started,
               **entry_point_answers(image["preflight"], "--help", expect="usage"))  # fmt: skip
        started = time.monotonic()
        # The model the image ships passes gymkube-train's check, and verl starts on the CPU
        # platform with the versions the lock pins.
        report("trainer-cpu model and platform", started, **entry_point_answers(
            image["trainer-cpu"], "gymkube-train", "--checkpoint-dir", "/tmp/checkpoints",
            "--model-path", CPU_MODEL, "--", "python3", "-c", CPU_PLATFORM_CHECK,
            expect="cpu verl 0.9.1 vllm 0.27.1"))  # fmt: skip
    except SmokeError as error:
        print(f"smoke_images: {error}", file=sys.stderr)
        sys.exit(1)
    finally:
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)


if __name__ == "__main__":
    main()
