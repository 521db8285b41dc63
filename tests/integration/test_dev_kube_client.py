"""The dev tooling's one cluster client (gymkube_dev.kube, used by `make up`, `make down` and the
e2e suite) against a real API server: the CRDs and examples applied server-side, a run that
failed last time deleted and waited for, the examples deleted (their finalizers removed when no
operator releases them), the chart installed and uninstalled, `make down` as a whole, the
diagnostics dump, a cluster that does not answer named as such."""

from pathlib import Path

import pytest
import yaml
from controlplane import ControlPlane
from gymkube_dev import chart, commands, diagnostics, examples, waits
from gymkube_dev.errors import StepError
from gymkube_dev.kube import Kube, KubeError, gymkube_path
from gymkube_dev.ports import free_port
from gymkube_dev.settings import UpSettings, UpState, load_state, save_state
from gymkube_operator.crds.catalog import RESOURCES
from operator_support import wait_for_crds

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(kube: ControlPlane) -> Kube:
    client = Kube(kube.kubeconfig)
    assert sorted(chart.apply_crds(client)) == sorted(resource.name for resource in RESOURCES)
    wait_for_crds(kube)
    return client


def test_examples_are_applied_read_back_and_deleted_with_kubectls_words(
    client: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = UpSettings(namespace=namespace, poll_interval_s=0.2)
    objects = examples.example_objects(small=True)
    examples.apply_examples(client, settings, objects)
    out = capsys.readouterr().out
    assert "envpool.gymkube.io/sciworld serverside-applied" in out
    assert "trainingrun.gymkube.io/frozen-lake-cpu serverside-applied" in out
    pool = examples.gymkube_object(client, "EnvPool", namespace, "sciworld")
    assert pool is not None
    assert pool["spec"]["warmSessionsPerReplica"] == 1  # the small-node override
    examples.apply_examples(client, settings, objects)  # idempotent

    examples.delete_examples(client, settings)
    out = capsys.readouterr().out
    assert 'envpool.gymkube.io "sciworld" deleted' in out
    assert "examples: deleted in" in out
    assert examples.gymkube_object(client, "EnvPool", namespace, "sciworld") is None


def test_examples_no_operator_releases_lose_their_finalizers(
    client: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(examples, "DELETE_TIMEOUT_S", 1.0)
    settings = UpSettings(namespace=namespace, poll_interval_s=0.2)
    examples.apply_examples(client, settings, examples.example_objects(small=True))
    path = gymkube_path("envpools", namespace, "frozen-lake")
    client.patch(path, {"metadata": {"finalizers": ["gymkube.io/test"]}})
    examples.delete_examples(client, settings)
    assert client.get(path) is None


def test_a_failed_run_is_deleted_and_waited_for(client: Kube, namespace: str) -> None:
    settings = UpSettings(namespace=namespace, poll_interval_s=0.2)
    objects = examples.example_objects(small=True)
    examples.apply_examples(client, settings, objects)
    path = gymkube_path("trainingruns", namespace, "frozen-lake-cpu")
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    failed |= {"message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    status, answer = client.request("PATCH", path + "/status", {"status": {"conditions": [failed]}})
    assert status == 200, answer
    examples.retry_failed_runs(client, settings, objects)
    assert client.get(path) is None
    assert client.get(gymkube_path("trainingruns", namespace, "frozen-lake-grpo")) is not None


def test_a_bad_object_and_an_absent_kind_are_clear_errors(client: Kube, namespace: str) -> None:
    bad = yaml.safe_load(
        "apiVersion: gymkube.io/v1alpha1\nkind: EnvPool\nmetadata: {name: bad}\n"
        "spec: {env: sciworld, replicas: -1}"
    )
    with pytest.raises(KubeError, match=r"applying envpool/bad: .*replicas"):
        client.apply(bad, field_manager="test", namespace=namespace)
    absent = {"apiVersion": "example.com/v1", "kind": "Nothing", "metadata": {"name": "x"}}
    with pytest.raises(KubeError, match=r"example\.com/v1 Nothing is not served"):
        client.apply(absent, field_manager="test", namespace=namespace)


def test_a_cluster_that_does_not_answer_is_named(kube: ControlPlane) -> None:
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    gone = kube.kubeconfig.parent / "unreachable.kubeconfig"
    gone.write_text(yaml.safe_dump(config))
    client = Kube(gone)
    assert not client.reachable()
    with pytest.raises(StepError, match="does not answer"):
        client.get("/api/v1/nodes")


def test_the_chart_installs_once_and_uninstalls_through_pyhelm3(
    client: Kube, namespace: str
) -> None:
    """No nodes here: the operator pod stays Pending, which is all a release needs."""
    values = chart.up_values("sha256:test")
    assert chart.install(client, "devtool", namespace, values) == 1
    assert chart.install(client, "devtool", namespace, values) == 1  # unchanged: no upgrade
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    assert client.names(deployments, chart.release_selector("devtool")) == ["devtool-gymkube"]
    assert chart.uninstall(client, "devtool", namespace, wait=False)
    assert not chart.uninstall(client, "devtool", namespace, wait=False)


def test_the_diagnostics_dump_has_every_section_even_when_there_is_little_to_say(
    client: Kube, namespace: str
) -> None:
    text = diagnostics.dump(client, namespace, namespace, "gymkube")
    titles = [line for line in text.splitlines() if line.startswith("===== ")]
    assert titles == [
        f"===== {title} =====" for title in diagnostics.sections(namespace, namespace, "gymkube")
    ]
    assert f"No resources found in {namespace} namespace." in text  # kubectl's own words


def test_make_down_takes_out_the_examples_and_the_release_and_leaves_the_cluster(
    kube: ControlPlane,
    client: Kube,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`make down` on a cluster `make up` found running (the state file says so)."""
    monkeypatch.setenv("GYMKUBE_CACHE", str(tmp_path))
    settings = UpSettings(
        namespace=namespace, operator_namespace=namespace, release="devdown", poll_interval_s=0.2
    )
    examples.apply_examples(client, settings, examples.example_objects(small=True))
    chart.install(client, settings.release, namespace, chart.up_values("sha256:test"))
    save_state(UpState(cluster="local", kubeconfig=str(kube.kubeconfig), started_cluster=False))

    commands.down(settings)
    out = capsys.readouterr().out
    assert 'trainingrun.gymkube.io "frozen-lake-cpu" deleted' in out
    assert "examples: deleted in" in out
    assert "release devdown uninstalled" in out
    assert "the local cluster was running before `make up`: left running" in out
    assert examples.gymkube_object(client, "EnvPool", namespace, "sciworld") is None
    assert load_state() == UpState()


def test_the_wait_fails_at_once_on_a_pool_no_waiting_fixes_and_names_a_slow_one(
    client: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = UpSettings(namespace=namespace, poll_interval_s=0.2, pool_timeout_s=1.0)
    objects = [o for o in examples.example_objects(small=True) if o["kind"] == "EnvPool"]
    examples.apply_examples(client, settings, objects)
    with pytest.raises(StepError, match=r"envpool/sciworld not ready after 1s: 0/2 servers ready"):
        waits.wait_examples(client, settings, waits.watch(settings, objects))
    assert "envpool/frozen-lake: 0/1 servers ready" in capsys.readouterr().out

    path = gymkube_path("envpools", namespace, "sciworld")
    generation = (client.get(path) or {})["metadata"]["generation"]
    stuck = {"type": "Degraded", "status": "True", "reason": "ImagePullFailed", "message": "m"}
    stuck["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    status = {"observedGeneration": generation, "conditions": [stuck]}
    assert client.request("PATCH", path + "/status", {"status": status})[0] == 200
    settings = UpSettings(namespace=namespace, poll_interval_s=0.2)
    with pytest.raises(StepError, match="envpool/sciworld failed: Degraded ImagePullFailed: m"):
        waits.wait_examples(client, settings, waits.watch(settings, objects))
