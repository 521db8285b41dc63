"""Pools whose servers cannot come up, on a real kubelet: the pool says why in its own status,
in the server's or the kubelet's words, instead of waiting in Progressing."""

import pytest
from e2e_cluster import (
    Cluster,
    E2ESettings,
    Object,
    condition,
    condition_is,
    envpool_manifest,
    gymkube_path,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CASES = [
    # The env server refuses the env at startup and exits; the kubelet restarts it.
    ("crash", {"env": "textarena:NoSuchGame-v0"}, "ServerCrashLoop", "NoSuchGame-v0"),
    # Nothing can be pulled on a cluster without a registry: the kubelet's own error shows.
    (
        "pull",
        {"env": "frozen_lake", "image": "gymkube/no-such-image:0"},
        "ImagePullFailed",
        "gymkube/no-such-image:0",
    ),
]


@pytest.mark.parametrize(("name", "spec", "reason", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_pool_that_cannot_come_up_says_why(
    operator: Cluster,
    settings: E2ESettings,
    namespace: str,
    name: str,
    spec: dict[str, str],
    reason: str,
    words: str,
) -> None:
    fields = {key: value for key, value in spec.items() if key != "env"}
    manifest = envpool_manifest(name, spec["env"], 1, **fields)
    operator.create(gymkube_path("envpools", namespace), manifest)
    path = gymkube_path("envpools", namespace, name)

    def degraded() -> Object | None:
        pool = operator.get(path)
        return condition(pool, "Degraded") if condition_is(pool, "Degraded") else None

    found = wait_until(degraded, timeout=settings.pod_start_timeout_s, what=f"{name}: Degraded")
    assert found["reason"] == reason, found
    assert words in found["message"], found
    assert "\n" not in found["message"]
    pool = operator.get(path)
    assert not condition_is(pool, "Ready")
    health = operator.kubectl("get", "envpool", name, "-n", namespace, "-o", "wide")
    assert reason in health
