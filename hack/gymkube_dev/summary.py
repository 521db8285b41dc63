"""What `make up` prints at the end: how to reach the cluster, each pool's URL and status, each
run's preflight summary and, for the CPU run, its steps, the pool's own counts, the checkpoint."""

import json
from collections.abc import Iterator

from gymkube_agentloop.train import PROGRESS_PREFIX
from gymkube_operator.envpool.reasons import ConditionType as Pool
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL

from gymkube_dev.console import clock, duration
from gymkube_dev.kube import Kube, api_path
from gymkube_dev.objects import ENVSERVER_PORT, Object, condition, pod_state
from gymkube_dev.settings import UpSettings
from gymkube_dev.waits import Watched, describe_progress, describe_run, trains_on_cpu


def preflight_lines(summary: Object) -> Iterator[str]:
    endings = ", ".join(f"{k} {v}" for k, v in (summary.get("endings") or {}).items())
    yield (
        f"{summary.get('episodes')} {summary.get('policy', '')} episodes on {summary.get('env')}: "
        f"{endings or 'no endings'}; mean score {summary.get('mean_score', 0):.2f}, "
        f"mean steps {summary.get('mean_steps', 0):.1f}"
    )
    errors = summary.get("env_errors") or {}
    yield f"env errors: {json.dumps(errors) if errors else 'none'}"
    latency = summary.get("latency_ms") or {}
    parts = [f"{call} {lat['p50']:.0f}" for call, lat in latency.items() if lat.get("p50")]
    if parts:
        yield f"latency p50 (ms): {', '.join(parts)}"


def job_pods(kube: Kube, namespace: str, job: object) -> list[Object]:
    return kube.list_objects(api_path("v1", "pods", namespace), f"job-name={job}")


def training_job_state(kube: Kube, settings: UpSettings, run: Object) -> str:
    child = (run.get("status") or {}).get("training") or {}
    if child.get("kind") != "Job":
        return f"{child.get('kind')}/{child.get('name')}"
    pods = job_pods(kube, settings.namespace, child["name"])
    states = "; ".join(pod_state(p) for p in pods) or "no pod yet"
    return f"job/{child['name']}: {states}"


def progress_records(log: str) -> list[Object]:
    """The trainer's progress lines, one per step, in the order it printed them."""
    records = []
    for line in log.splitlines():
        if line.startswith(PROGRESS_PREFIX):
            try:
                records.append(json.loads(line.removeprefix(PROGRESS_PREFIX)))
            except ValueError:
                continue
    return records


def metric_sum(metrics: str, name: str) -> float:
    """The sum of every sample of one Prometheus metric in a /metrics text (all label sets)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def pool_episodes(kube: Kube, settings: UpSettings, pool: str) -> str:
    """What the pool's env servers counted themselves, read through the API server's pod proxy."""
    ns = settings.namespace
    selector = f"{POOL_LABEL}={pool},{COMPONENT_LABEL}=envserver"
    episodes = scores = 0.0
    for pod in kube.list_objects(api_path("v1", "pods", ns), selector):
        name = pod["metadata"]["name"]
        proxy = api_path("v1", "pods", ns, f"{name}:{ENVSERVER_PORT}") + "/proxy/metrics"
        text = (kube.get_bytes(proxy) or b"").decode()
        episodes += metric_sum(text, "gymkube_envserver_episodes_total")
        scores += metric_sum(text, "gymkube_envserver_episode_score_total")
    return f"{episodes:.0f} episodes, scores summing to {scores:g}"


def cpu_training_lines(kube: Kube, settings: UpSettings, run: Object) -> Iterator[str]:
    """Per-step rewards and times from the trainer's own log, the pool's counts, the checkpoint."""
    status = run.get("status") or {}
    child = status.get("training") or {}
    ns = settings.namespace
    log = b""
    for pod in job_pods(kube, ns, child.get("name")):
        path = api_path("v1", "pods", ns, pod["metadata"]["name"]) + "/log"
        log += kube.get_bytes(path, {"container": "trainer"}) or b""
    yield f"training job/{child.get('name')} on CPU: {describe_run(run)}"
    for record in progress_records(log.decode(errors="replace")):
        yield f"  {describe_progress(record)}"
    pool = (run.get("spec") or {}).get("envPoolRef", {}).get("name", "")
    counts = pool_episodes(kube, settings, pool)
    yield f"env pool {pool} served (its own counts, preflight included): {counts}"
    progress = status.get("progress") or {}
    where = progress.get("checkpoint") or "none written"
    volume = (run.get("spec") or {}).get("checkpoints")
    kept = "on the checkpoints volume" if volume else "in an emptyDir, gone with the pod"
    yield f"last checkpoint: {where} ({kept})"


def pool_line(item: Watched, width: int) -> str:
    assert item.obj is not None
    status = item.obj.get("status") or {}
    ready = condition(item.obj, Pool.READY) or {}
    return (
        f"  {item.name:<{width}} {'Ready' if ready.get('status') == 'True' else 'NotReady':<9}"
        f"{status.get('readyReplicas', 0)}/{item.obj['spec'].get('replicas')} servers  "
        f"capacity {status.get('capacity', 0):<4} {status.get('url', '(no URL yet)')}  "
        f"(apply → Ready {duration(item.ready_after or 0)})"
    )


def run_lines(kube: Kube, settings: UpSettings, item: Watched) -> Iterator[str]:
    assert item.obj is not None
    status = item.obj.get("status") or {}
    yield f"\nTrainingRun {item.name}: phase {status.get('phase')}, pool {status.get('envPoolUrl')}"
    preflight = status.get("preflight") or {}
    summary = preflight.get("summary")
    yield f"  preflight job/{preflight.get('jobName')}: passed={preflight.get('passed')}"
    for line in preflight_lines(summary) if summary else [str(preflight.get("message"))]:
        yield f"    {line}"
    if trains_on_cpu(item.obj):
        for line in cpu_training_lines(kube, settings, item.obj):
            yield f"  {line}"
        return
    yield f"  training {training_job_state(kube, settings, item.obj)}"
    yield "    (it asks for GPUs: without a GPU node it stays Pending, as expected)"


def print_summary(
    kube: Kube, settings: UpSettings, flavour: str, watched: list[Watched], small: bool
) -> None:
    ns = settings.namespace
    print(f"\n[{clock()}] gymkube is up on the {flavour} cluster.\n")
    print(f"  export KUBECONFIG={kube.kubeconfig}")
    print(f"  kubectl get envpools,trainingruns -n {ns}\n")
    print(f"EnvPools (namespace {ns}{', small-node overrides' if small else ''}):")
    pools = [i for i in watched if i.kind == "EnvPool" and i.obj is not None]
    width = max((len(i.name) for i in watched if i.kind == "EnvPool"), default=12)
    for item in pools:
        print(pool_line(item, width))
    for item in watched:
        if item.kind == "TrainingRun" and item.obj is not None:
            for line in run_lines(kube, settings, item):
                print(line)
    print(
        f"\nFrom this machine: kubectl -n {ns} port-forward svc/frozen-lake "
        f"{ENVSERVER_PORT}:{ENVSERVER_PORT}, then http://127.0.0.1:{ENVSERVER_PORT}/tasks\n"
        "`make down` removes it all."
    )
