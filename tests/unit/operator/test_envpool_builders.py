"""The pure builders: an EnvPool spec becomes exactly the children a user expects."""

from typing import Any

import pytest
from gymkube_envserver.settings import (
    DEFAULT_RECYCLE_AFTER_EPISODES,
    DEFAULT_RECYCLE_RSS_MIB,
    ServerSettings,
)
from gymkube_operator.envpool import builders
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.settings import OperatorSettings
from pydantic_settings import CliApp

pytestmark = pytest.mark.unit

POOL = builders.owner("sciworld", "rl", "0b8f-uid")
SETTINGS = OperatorSettings(envserver_image="reg/envserver:1", router_image="reg/router:1")


def spec(**fields: Any) -> EnvPoolSpec:
    return EnvPoolSpec.model_validate({"env": "sciworld", **fields})


def children(**fields: Any) -> dict[tuple[str, str], dict[str, Any]]:
    built = builders.build_children(POOL, spec(**fields), SETTINGS)
    return {(c["kind"], c["metadata"]["name"]): c for c in built}


def envserver(**fields: Any) -> dict[str, Any]:
    pod = children(**fields)[("StatefulSet", "sciworld")]["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return container


def test_a_pool_owns_five_children_all_pointing_back_at_it() -> None:
    built = children()
    assert set(built) == {
        ("StatefulSet", "sciworld"),
        ("Service", "sciworld-backends"),
        ("Deployment", "sciworld-router"),
        ("Service", "sciworld"),
        ("PodDisruptionBudget", "sciworld"),
    }
    for child in built.values():
        assert child["metadata"]["namespace"] == "rl"
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "gymkube.io/v1alpha1",
            "kind": "EnvPool",
            "name": "sciworld",
            "uid": "0b8f-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_env_servers_run_under_the_restricted_pod_security_standard() -> None:
    pod = children()[("StatefulSet", "sciworld")]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]


def test_a_server_that_exits_leaves_its_last_log_lines_in_the_pod_status() -> None:
    # The watchdog reads them for the Degraded message (envpool.pods).
    assert envserver()["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_env_server_command_carries_the_spec() -> None:
    container = envserver(
        replicas=3, sessionsPerReplica=8, warmSessionsPerReplica=3, args=["--log-level", "debug"]
    )
    assert "command" not in container  # the image's entrypoint is gymkube-envserver
    args = container["args"]
    assert args[args.index("--env") + 1] == "sciworld"
    assert args[args.index("--max-sessions") + 1] == "8"
    assert args[args.index("--warm") + 1] == "3"
    assert args[-2:] == ["--log-level", "debug"]
    assert container["image"] == "reg/envserver:1"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_env_reuse_reaches_the_servers_settings() -> None:
    # A pool's defaults are the server's own (chosen by measurement, docs/envserver.md).
    defaults = CliApp.run(ServerSettings, cli_args=envserver()["args"])
    assert (defaults.reuse, defaults.recycle_after_episodes, defaults.recycle_rss_mib) == (
        True,
        DEFAULT_RECYCLE_AFTER_EPISODES,
        DEFAULT_RECYCLE_RSS_MIB,
    )
    reuse = {"enabled": False, "recycleAfterEpisodes": 50, "recycleRssMib": 0}
    tuned = CliApp.run(ServerSettings, cli_args=envserver(envReuse=reuse)["args"])
    assert (tuned.reuse, tuned.recycle_after_episodes, tuned.recycle_rss_mib) == (False, 50, 0)


def test_env_config_is_the_servers_default_and_a_change_rolls_the_pods() -> None:
    config = {"size": 2, "moves": "word"}
    args = envserver(env="frozen_lake", envConfig=config)["args"]
    assert args[args.index("--env-config") + 1] == '{"moves":"word","size":2}'
    assert CliApp.run(ServerSettings, cli_args=args).env_config == config
    assert "--env-config" not in envserver()["args"]
    # A StatefulSet rolls its pods when their template changes.
    sts = ("StatefulSet", "sciworld")
    two, three = (children(envConfig={"size": size})[sts] for size in (2, 3))
    assert two["spec"]["template"] != three["spec"]["template"]


def test_spec_image_and_resources_win_over_operator_defaults() -> None:
    resources = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "12Gi"}}
    container = envserver(image="mine/envserver:2", resources=resources)
    assert container["image"] == "mine/envserver:2"
    assert container["resources"] == resources


def test_rollouts_drain_before_a_server_stops() -> None:
    built = children(watchdog={"drainTimeoutSeconds": 120})
    pod = built[("StatefulSet", "sciworld")]["spec"]["template"]["spec"]
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert "/admin/drain" in hook[2]
    assert hook[-1] == "120"
    assert pod["terminationGracePeriodSeconds"] > 120


def test_pod_template_overrides_merge_into_the_env_server_pods() -> None:
    override = {
        "nodeSelector": {"pool": "cpu"},
        "containers": [{"name": "envserver", "env": [{"name": "EXTRA", "value": "1"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    pod = children(podTemplate=override)[("StatefulSet", "sciworld")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    (container,) = pod["containers"]
    names = [e["name"] for e in container["env"]]
    assert names == ["HOME", "TMPDIR", "EXTRA"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "data"]


def test_router_reaches_the_backends_through_the_headless_service() -> None:
    built = children(router={"replicas": 2})
    backends = built[("Service", "sciworld-backends")]["spec"]
    assert backends["clusterIP"] == "None"
    assert backends["publishNotReadyAddresses"] is True
    router = built[("Deployment", "sciworld-router")]
    assert router["spec"]["replicas"] == 2
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container
    assert "sciworld-backends.rl.svc:8000" in container["args"]
    assert container["image"] == "reg/router:1"
    pool_service = built[("Service", "sciworld")]["spec"]
    assert pool_service["selector"] == router["spec"]["selector"]["matchLabels"]
    assert builders.pool_url("sciworld", "rl", 8000) == "http://sciworld.rl.svc:8000"


def test_an_autoscaled_pools_router_holds_creates_while_the_pool_grows() -> None:
    def router_args(**fields: Any) -> list[str]:
        router = children(**fields)[("Deployment", "sciworld-router")]
        args: list[str] = router["spec"]["template"]["spec"]["containers"][0]["args"]
        return args

    assert "--create-hold" not in router_args()
    held = router_args(autoscaling={"maxReplicas": 4, "createHoldSeconds": 90})
    assert held[held.index("--create-hold") + 1] == "90"


def test_suspend_scales_servers_and_router_to_zero() -> None:
    built = children(replicas=4, suspend=True)
    assert built[("StatefulSet", "sciworld")]["spec"]["replicas"] == 0
    assert built[("Deployment", "sciworld-router")]["spec"]["replicas"] == 0


def test_disruption_budget_follows_max_unavailable() -> None:
    pdb = children(watchdog={"maxUnavailable": 2})[("PodDisruptionBudget", "sciworld")]
    assert pdb["spec"]["maxUnavailable"] == 2
    sts = children()[("StatefulSet", "sciworld")]
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    selector = dict(part.split("=") for part in builders.selector_string("sciworld").split(","))
    assert selector.items() <= labels.items()


def test_building_twice_gives_the_same_objects() -> None:
    assert builders.build_children(POOL, spec(), SETTINGS) == builders.build_children(
        POOL, spec(), SETTINGS
    )
