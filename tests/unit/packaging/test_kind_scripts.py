"""kind's shell pieces that run without Docker: the runc wrapper hack/ensure-docker.sh makes the
default runtime of the dockerd it starts, and the cluster config hack/kind-up.sh gives kind for each
node image."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]
WRAPPER = REPO_ROOT / "hack" / "kind" / "runc-host-caps"
# A few capabilities with their bits (linux/capability.h); CAP_SYS_RESOURCE is the one sandboxed
# VMs often lack.
SOME_CAPS = {"CAP_CHOWN": 0, "CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24}
EVERY_CAP = list(SOME_CAPS)
# Those Docker 20.10 does not know, which a privileged container gets where the host has them.
NEWER_CAPS = {"CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40}


def _host_has(caps: dict[str, int]) -> list[str]:
    status = Path("/proc/self/status").read_text()
    (bounding,) = (line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:"))
    return [cap for cap, bit in caps.items() if int(bounding, 16) >> bit & 1]


def _grantable() -> set[str]:
    return set(_host_has(SOME_CAPS))


def _run_wrapper(tmp_path: Path, *args: str) -> list[str]:
    """Runs the wrapper with a stand-in runc that records its arguments; returns them."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "runc-args"
    runc = fake_bin / "runc"
    runc.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    runc.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    subprocess.run([str(WRAPPER), *args], env=env, check=True, timeout=30)
    return record.read_text().splitlines()


def test_a_privileged_container_gets_every_capability_the_host_can_grant_and_no_other(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    sets = {kind: list(EVERY_CAP) for kind in ("bounding", "effective", "permitted", "inheritable")}
    (bundle / "config.json").write_text(json.dumps({"process": {"capabilities": sets}}))
    args = ["--root", "/run/r", "--log-format", "json", "create", "--bundle", str(bundle), "c1"]

    assert _run_wrapper(tmp_path, *args) == args, "runc gets the same arguments"

    granted = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    expected = [cap for cap in EVERY_CAP if cap in _grantable()] + _host_has(NEWER_CAPS)
    assert granted == {kind: expected for kind in sets}


def test_a_container_without_cap_sys_admin_gets_no_newer_capability(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    asked = ["CAP_CHOWN", "CAP_NET_ADMIN"]
    (bundle / "config.json").write_text(
        json.dumps({"process": {"capabilities": {"bounding": asked, "effective": asked}}})
    )

    _run_wrapper(tmp_path, "create", "--bundle", str(bundle), "c1")

    granted = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    assert granted == {"bounding": asked, "effective": asked}


def test_docker_exec_privileged_gets_the_same_treatment(tmp_path: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": {"bounding": EVERY_CAP}}))

    _run_wrapper(tmp_path, "exec", "--process", str(process), "--detach", "c1")

    granted = json.loads(process.read_text())
    assert granted["args"] == ["sh"]
    assert granted["capabilities"]["bounding"] == [
        *(c for c in EVERY_CAP if c in _grantable()),
        *_host_has(NEWER_CAPS),
    ]


def _kind_config(image_var: str) -> dict[str, object]:
    out = subprocess.run(
        ["bash", "-c", f'source hack/lib/kind-common.sh && kind_cluster_config "${image_var}"'],
        capture_output=True, text=True, cwd=REPO_ROOT, check=True, timeout=30,
    )  # fmt: skip
    config: dict[str, object] = yaml.safe_load(out.stdout)
    return config


def _versions() -> dict[str, str]:
    lines = (REPO_ROOT / "hack" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


REGISTRY_HOSTS_PATCH = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"'
)


def test_kinds_own_node_image_gets_kinds_defaults_and_registry_hosts() -> None:
    assert _kind_config("KIND_UPSTREAM_NODE_IMAGE") == {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "containerdConfigPatches": [REGISTRY_HOSTS_PATCH],
    }


def test_the_node_image_built_here_gets_its_cni_and_its_etcd_and_coredns_tags() -> None:
    config = _kind_config("KIND_LOCAL_NODE_IMAGE")
    assert config["containerdConfigPatches"] == [REGISTRY_HOSTS_PATCH]
    assert config["networking"] == {"disableDefaultCNI": True, "podSubnet": "10.244.0.0/16"}
    patches = config["kubeadmConfigPatches"]
    assert isinstance(patches, list)
    assert len(patches) == 1
    cluster_config = yaml.safe_load(patches[0])
    etcd_version = _versions()["ETCD_VERSION"].removeprefix("v")
    assert cluster_config["etcd"]["local"]["imageTag"] == f"{etcd_version}-0"
    assert cluster_config["dns"]["imageTag"].startswith("v1.")
