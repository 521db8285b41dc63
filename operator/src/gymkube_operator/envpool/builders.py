"""Pure builders: an EnvPool spec in, the wanted child objects out. No cluster access here."""

import json
from typing import Any

from gymkube_operator.envpool.models import KIND, OPENENV, EnvPoolSpec
from gymkube_operator.kinds import ResourceRequirements
from gymkube_operator.labels import (
    COMPONENT_LABEL,
    POOL_CLIENT_LABEL,
    POOL_LABEL,
    pool_client_label,
)
from gymkube_operator.objects import RESTRICTED_CONTAINER, RESTRICTED_POD, Object, Owner, merge
from gymkube_operator.settings import OperatorSettings

ENVSERVER = "envserver"
ROUTER = "router"
ENVSERVER_CONTAINER = "envserver"
ROUTER_CONTAINER = "router"
# Kubelet gets this long past the drain timeout to stop the server after its preStop drain.
GRACE_AFTER_DRAIN = 30
HTTP_PORT_NAME = "http"
ADMIN_PORT_NAME = "admin"

# preStop hook: stop taking new sessions, then wait (within the grace period) until the live ones
# end, so a rollout or scale-down never cuts an episode short. Uses only the image's Python; talks
# to the admin port, which serves /status too.
DRAIN_SCRIPT = """\
import json, sys, time, urllib.request
base = "http://127.0.0.1:" + sys.argv[1]
deadline = time.monotonic() + float(sys.argv[2])
try:
    urllib.request.urlopen(urllib.request.Request(base + "/admin/drain", method="POST"), timeout=5)
    while time.monotonic() < deadline:
        if json.load(urllib.request.urlopen(base + "/status", timeout=5)).get("active", 0) == 0:
            break
        time.sleep(1)
except OSError:
    pass
"""


def owner(name: str, namespace: str, uid: str) -> Owner:
    return Owner(kind=KIND, name=name, namespace=namespace, uid=uid)


def backends_name(pool: str) -> str:
    return f"{pool}-backends"


def router_name(pool: str) -> str:
    return f"{pool}-router"


def network_policy_name(pool: str) -> str:
    return f"{pool}-envservers"


def pool_url(pool: str, namespace: str, port: int) -> str:
    return f"http://{pool}.{namespace}.svc:{port}"


def selector_labels(pool: str, component: str) -> dict[str, str]:
    return {POOL_LABEL: pool, COMPONENT_LABEL: component}


def selector_string(pool: str) -> str:
    """status.selector, which the scale subresource hands to `kubectl scale` and HPAs."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(pool, ENVSERVER).items())


def labels(pool: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": f"gymkube-{component}",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/managed-by": "gymkube-operator",
        **selector_labels(pool, component),
    }


def _resources(requirements: ResourceRequirements) -> Object:
    return {k: v for k, v in requirements.to_api().items() if v}


def _http_probe(path: str, period: int, failures: int) -> Object:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT_NAME},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def _container(
    name: str, image: str, args: list[str], port: int, settings: OperatorSettings
) -> Object:
    # Only args: the image's entrypoint (tini, then gymkube-envserver or gymkube-router) runs.
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": args,
        # The root filesystem is read-only: anything that writes a home or temp dir uses /tmp.
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "TMPDIR", "value": "/tmp"}],
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "livenessProbe": _http_probe(
            "/healthz",
            settings.liveness_probe_period_seconds,
            settings.liveness_probe_failure_threshold,
        ),
        "readinessProbe": _http_probe("/readyz", settings.readiness_probe_period_seconds, 1),
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_spec(container: Object, grace_seconds: int) -> Object:
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": RESTRICTED_POD,
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }


def envserver_args(spec: EnvPoolSpec) -> list[str]:
    # Sorted keys: the same envConfig always renders the same pod template (no needless rollout);
    # none when unset, so pools without one keep their pods across an operator upgrade.
    env_config = (
        ["--env-config", json.dumps(spec.env_config, separators=(",", ":"), sort_keys=True)]
        if spec.env_config
        else []
    )
    return [
        "--env",
        spec.env,
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.port),
        "--admin-port",
        str(spec.admin_port),
        "--max-sessions",
        str(spec.sessions_per_replica),
        "--warm",
        str(spec.warm_sessions_per_replica),
        "--idle-timeout",
        str(spec.idle_timeout_seconds),
        "--reuse",
        "true" if spec.env_reuse.enabled else "false",
        "--recycle-after-episodes",
        str(spec.env_reuse.recycle_after_episodes),
        "--recycle-rss-mib",
        str(spec.env_reuse.recycle_rss_mib),
        "--canary-interval",
        str(spec.watchdog.canary_interval_seconds),
        "--canary-timeout",
        str(spec.watchdog.canary_timeout_seconds),
        *env_config,
        *spec.args,
    ]


def build_statefulset(pool: Owner, spec: EnvPoolSpec, settings: OperatorSettings) -> Object:
    drain = spec.watchdog.drain_timeout_seconds
    container = _container(
        ENVSERVER_CONTAINER,
        spec.image or settings.envserver_image,
        envserver_args(spec),
        spec.port,
        settings,
    )
    container["resources"] = _resources(spec.resources)
    container["startupProbe"] = _http_probe(
        "/healthz",
        settings.startup_probe_period_seconds,
        settings.startup_probe_failure_threshold,
    )
    # A server that exits on a bad env or setting says why in its last log lines: the kubelet puts
    # them into the pod status, where the watchdog reads them for the Degraded message.
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if spec.env == OPENENV:
        _as_openenv_server(container, spec)
    else:
        container["ports"].append({"name": ADMIN_PORT_NAME, "containerPort": spec.admin_port})
        drain_command = ["python3", "-c", DRAIN_SCRIPT, str(spec.admin_port), str(drain)]
        container["lifecycle"] = {"preStop": {"exec": {"command": drain_command}}}
    pod_spec = merge(_pod_spec(container, drain + GRACE_AFTER_DRAIN), spec.pod_template)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": pool.metadata(pool.name, labels(pool.name, ENVSERVER)),
        "spec": {
            "serviceName": backends_name(pool.name),
            "replicas": 0 if spec.suspend else spec.replicas,
            # Servers are interchangeable: start and stop them all at once, not one by one.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector_labels(pool.name, ENVSERVER)},
            "template": {
                "metadata": {"labels": labels(pool.name, ENVSERVER)},
                "spec": pod_spec,
            },
        },
    }


def _as_openenv_server(container: Object, spec: EnvPoolSpec) -> None:
    """The image's own command (an OpenEnv server, uvicorn on spec.port as OpenEnv's images
    run), its session limit from the spec, and OpenEnv's /health for every kubelet probe."""
    del container["args"]
    container["env"].append(
        {"name": "MAX_CONCURRENT_ENVS", "value": str(spec.sessions_per_replica)}
    )
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        container[probe]["httpGet"]["path"] = "/health"


def build_backends_service(pool: Owner, spec: EnvPoolSpec) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pool.metadata(backends_name(pool.name), labels(pool.name, ENVSERVER)),
        "spec": {
            "clusterIP": "None",
            # A draining server is unready but still serves its live sessions: the router must
            # keep resolving it.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(pool.name, ENVSERVER),
            "ports": [{"name": HTTP_PORT_NAME, "port": spec.port, "targetPort": HTTP_PORT_NAME}],
        },
    }


# A terminating router serves this long: the Service's endpoints drop it meanwhile, so a client
# never connects to its closed port during a rollout (an e2e helm upgrade saw one refused).
ROUTER_SHUTDOWN_DELAY_S = 5


def build_router_deployment(pool: Owner, spec: EnvPoolSpec, settings: OperatorSettings) -> Object:
    backends = f"{backends_name(pool.name)}.{pool.namespace}.svc:{spec.port}"
    args = ["--host", "0.0.0.0", "--port", str(spec.port), "--backends-dns", backends]
    args += ["--shutdown-delay", str(ROUTER_SHUTDOWN_DELAY_S)]
    if spec.env == OPENENV:
        capacity = str(spec.sessions_per_replica)
        args += ["--backend-protocol", "openenv", "--backend-capacity", capacity]
    if spec.autoscaling is not None:
        args += ["--create-hold", str(spec.autoscaling.create_hold_seconds)]
    container = _container(
        ROUTER_CONTAINER,
        spec.router.image or settings.router_image,
        args,
        spec.port,
        settings,
    )
    container["resources"] = _resources(spec.router.resources)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pool.metadata(router_name(pool.name), labels(pool.name, ROUTER)),
        "spec": {
            "replicas": 0 if spec.suspend else spec.router.replicas,
            "selector": {"matchLabels": selector_labels(pool.name, ROUTER)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": labels(pool.name, ROUTER)},
                "spec": _pod_spec(container, GRACE_AFTER_DRAIN),
            },
        },
    }


def build_pool_service(pool: Owner, spec: EnvPoolSpec) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pool.metadata(pool.name, labels(pool.name, ROUTER)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(pool.name, ROUTER),
            "ports": [{"name": HTTP_PORT_NAME, "port": spec.port, "targetPort": HTTP_PORT_NAME}],
        },
    }


def build_disruption_budget(pool: Owner, spec: EnvPoolSpec) -> Object:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": pool.metadata(pool.name, labels(pool.name, ENVSERVER)),
        "spec": {
            "maxUnavailable": spec.watchdog.max_unavailable,
            "selector": {"matchLabels": selector_labels(pool.name, ENVSERVER)},
        },
    }


def build_network_policy(pool: Owner, spec: EnvPoolSpec, settings: OperatorSettings) -> Object:
    """Who may reach the env servers: sessions from the pool's routers and its TrainingRuns' pods,
    probes and drains from the operator, /metrics from the scrapers the settings name. The
    routers (the pool URL) are left open: they are what clients call."""
    operator = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}
        },
        "podSelector": {"matchLabels": settings.operator_pod_labels},
    }
    routers = {"podSelector": {"matchLabels": selector_labels(pool.name, ROUTER)}}
    clients = {"podSelector": {"matchLabels": {POOL_CLIENT_LABEL: pool.name}}}
    mixed_clients = {"podSelector": {"matchLabels": {pool_client_label(pool.name): "true"}}}
    # The env servers serve /metrics on the session port: a Prometheus the user names scrapes it.
    scrapers = (
        [
            {
                "namespaceSelector": {"matchLabels": settings.metrics_scraper_namespace_labels},
                "podSelector": {"matchLabels": settings.metrics_scraper_pod_labels},
            }
        ]
        if settings.metrics_scraper_namespace_labels or settings.metrics_scraper_pod_labels
        else []
    )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": pool.metadata(network_policy_name(pool.name), labels(pool.name, ENVSERVER)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(pool.name, ENVSERVER)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [routers, clients, mixed_clients, operator, *scrapers],
                    "ports": [{"port": HTTP_PORT_NAME, "protocol": "TCP"}],
                },
                {"from": [operator], "ports": [{"port": ADMIN_PORT_NAME, "protocol": "TCP"}]},
            ],
        },
    }


def build_children(pool: Owner, spec: EnvPoolSpec, settings: OperatorSettings) -> list[Object]:
    """Every object an EnvPool owns, in the order they are applied (backends before router)."""
    return [
        build_backends_service(pool, spec),
        build_statefulset(pool, spec, settings),
        build_router_deployment(pool, spec, settings),
        build_pool_service(pool, spec),
        build_disruption_budget(pool, spec),
        *([build_network_policy(pool, spec, settings)] if settings.network_policy else []),
    ]


def parse_spec(raw: Any) -> EnvPoolSpec:
    return EnvPoolSpec.model_validate(dict(raw))
