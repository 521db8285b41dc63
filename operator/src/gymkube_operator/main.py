"""`gymkube-operator`: run the EnvPool, TrainingRun and EvalRun operator with settings from
GYMKUBE_* variables."""

import asyncio
import contextlib
import logging
import os
import pathlib
import sys
import threading
from typing import Any

import kopf
from aiohttp import web
from pydantic import ValidationError

from gymkube_operator import metrics
from gymkube_operator.envpool import handlers as envpool_handlers
from gymkube_operator.envpool.prober import AddressResolver
from gymkube_operator.evalrun import handlers as evalrun_handlers
from gymkube_operator.runtime import Runtime
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun import handlers as trainingrun_handlers


class QuietWakers(logging.Filter):
    """Drops kopf's "Handler '…' succeeded." line for the handlers that only wake a daemon: one
    per watch event (12,000 in a 1,000-pool start), saying nothing, burying the lines that do."""

    SILENT = frozenset(
        f"Handler {name!r} succeeded."
        for name in (
            envpool_handlers.POOL_WAKER,
            *trainingrun_handlers.RUN_WAKERS,
            *evalrun_handlers.EVAL_WAKERS,
        )
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.SILENT


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    config = kopf.OperatorSettings()
    prefix = settings.prefix
    # kopf's finalizer and bookkeeping annotations live under gymkube's own API group.
    config.persistence.finalizer = f"{prefix}/finalizer"
    config.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    config.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    config.posting.reporting_component = "gymkube-operator"
    # Bounded watches: a silently dropped connection is noticed and re-established.
    config.watching.server_timeout = 300
    config.watching.client_timeout = 330
    config.peering.standalone = True
    # With a watch list, namespaced RBAC cannot list namespaces or CRDs cluster-wide;
    # scanning would retry refused requests for a minute before kopf falls back.
    config.scanning.disabled = bool(settings.namespaces)
    return config


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo:
        # In a pod the service account wins; elsewhere the KUBECONFIG file.
        info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        if info is None:
            raise kopf.LoginError("no service account and no KUBECONFIG to log in with")
        await runtime.connect(info)
        return info

    served: list[web.AppRunner] = []

    @kopf.on.startup(registry=registry)
    async def serve_metrics(**_: Any) -> None:
        if runtime.settings.metrics_port:
            served.append(await metrics.start_server("0.0.0.0", runtime.settings.metrics_port))

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        for runner in served:
            await runner.cleanup()
        await runtime.close()

    envpool_handlers.register(registry, runtime)
    trainingrun_handlers.register(registry, runtime)
    evalrun_handlers.register(registry, runtime)
    return registry


async def run(
    settings: OperatorSettings,
    *,
    resolve: AddressResolver | None = None,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Run the operator until stop_flag is set (or forever); tests pass their own resolver."""
    runtime = Runtime(settings=settings, resolver=resolve)
    port = settings.liveness_port
    await kopf.operator(
        registry=build_registry(runtime),
        settings=kopf_settings(settings),
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=f"http://0.0.0.0:{port}/healthz" if port else None,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


SERVICE_ACCOUNT_TOKEN = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def has_credentials() -> bool:
    kubeconfig = os.environ.get("KUBECONFIG") or str(pathlib.Path.home() / ".kube" / "config")
    paths = [pathlib.Path(p) for p in kubeconfig.split(os.pathsep) if p]
    return SERVICE_ACCOUNT_TOKEN.exists() or any(p.is_file() for p in paths)


def main() -> None:
    try:
        settings = OperatorSettings()
    except ValidationError as error:
        print(f"gymkube-operator: bad settings:\n{error}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not has_credentials():
        print(
            "gymkube-operator: no service-account token and no kubeconfig "
            "(set KUBECONFIG or run in a pod)",
            file=sys.stderr,
        )
        sys.exit(2)
    logging.getLogger("kopf.objects").addFilter(QuietWakers())
    scope = ", ".join(settings.namespaces) or "all namespaces"
    logging.getLogger("gymkube_operator").info("watching %s", scope)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings))
