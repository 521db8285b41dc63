"""A private Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager.

All three run as child processes on free loopback ports inside one temporary directory, with
certificates generated for the run, client-certificate authentication, RBAC, and an admin
kubeconfig nobody else uses. The caller's KUBECONFIG is never read: every client handed out here is
bound to a kubeconfig this module wrote, and anything else is refused.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gymkube_dev.tools import tool_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
START_TIMEOUT_S = 120.0
KUBECTL_TIMEOUT_S = 120.0
# kubectl flags that would point it at another cluster or identity than the one passed here.
_TARGET_FLAGS = ("--kubeconfig", "--server", "-s", "--context")


class ControlPlaneError(RuntimeError):
    """The control plane failed to start, or was asked to use a cluster it did not create."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; unlike its base class, the message carries kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr.strip()}"


def tool_bin_dir() -> Path:
    """The directory of the pinned binaries, as hack/build-tools.sh lays it out."""
    bin_dir = tool_dir()
    if bin_dir is None:
        raise ControlPlaneError(
            "hack/tool-path.sh did not answer; build the tools with `make tools`"
        )
    missing = [name for name in REQUIRED_BINARIES if not (bin_dir / name).is_file()]
    if missing:
        raise ControlPlaneError(
            f"{', '.join(missing)} not found in {bin_dir}; build them with `make tools`"
        )
    return bin_dir


# --- certificates -------------------------------------------------------------------------------

# P-256 keys: generating one takes microseconds, an RSA-2048 key tens of milliseconds.
_CURVE = ec.SECP256R1()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class _Credentials:
    cert_pem: bytes
    key_pem: bytes


class _CertificateAuthority:
    def __init__(self, name: str) -> None:
        self._key = ec.generate_private_key(_CURVE)
        self._subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            self._builder(self._subject, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.credentials = _Credentials(
            cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key)
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        # Backdated an hour so a slightly skewed clock never sees a not-yet-valid certificate.
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
        )

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        server_names: Sequence[str] = (),
    ) -> _Credentials:
        """A client certificate, or a serving one when server_names (DNS names, IPs) are given.

        Kubernetes reads the user name from CN and the groups from the O entries.
        """
        key = ec.generate_private_key(_CURVE)
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(name) for name in server_names]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return _Credentials(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_private(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(data)
    return path


def _write_kubeconfig(
    path: Path, server: str, ca_pem: bytes, user: str, creds: _Credentials
) -> Path:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gymkube-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(creds.cert_pem),
                    "client-key-data": b64(creds.key_pem),
                },
            }
        ],
        "contexts": [
            {"name": "gymkube-test", "context": {"cluster": "gymkube-test", "user": user}}
        ],
        "current-context": "gymkube-test",
    }
    # JSON is YAML, and a kubeconfig needs nothing more.
    return _write_private(path, json.dumps(config, indent=2).encode())


# --- processes ----------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the test process is killed outright, the kernel kills
    # the control plane too instead of leaving it running.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self._popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def check_running(self) -> None:
        code = self._popen.poll()
        if code is not None:
            raise ControlPlaneError(f"{self.name} exited with code {code}:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()


def _free_ports(count: int) -> list[int]:
    # All sockets stay open until every port is picked, so the ports are distinct.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


# --- the control plane --------------------------------------------------------------------------


@dataclass
class ControlPlane:
    """A running control plane and the only ways tests should talk to it."""

    kubeconfig: Path
    bin_dir: Path
    server: str
    workdir: Path
    startup_seconds: float
    _server_ca_pem: bytes = field(repr=False)
    _client_ca: _CertificateAuthority = field(repr=False)

    def env(self) -> dict[str, str]:
        """os.environ for a subprocess (an operator, kubectl, helm) that must use this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        # Never let a client fall back to in-cluster config when the tests run inside a pod.
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("KUBERNETES_SERVICE_PORT", None)
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl as admin, or as the user of a `--kubeconfig=` from kubeconfig_for_user."""
        kubeconfig = self.kubeconfig
        rest: list[str] = []
        for arg in args:
            flag, _, value = arg.partition("=")
            if flag == "--kubeconfig" and value:
                kubeconfig = self.own_kubeconfig(Path(value))
            elif flag in _TARGET_FLAGS:
                raise ControlPlaneError(
                    f"kubectl {arg!r}: this helper only talks to its own cluster; "
                    "pass --kubeconfig=<file from kubeconfig_for_user> to act as another user"
                )
            else:
                rest.append(arg)
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *rest]
        env = self.env()
        env["KUBECONFIG"] = str(kubeconfig)
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, env=env, timeout=KUBECTL_TIMEOUT_S
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def api_client(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """A fresh client bound to the admin kubeconfig, or to one from kubeconfig_for_user."""
        path = self.own_kubeconfig(kubeconfig or self.kubeconfig)
        client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(path)
        )
        if client.configuration.host != self.server:
            raise ControlPlaneError(
                f"{path} points at {client.configuration.host}, not {self.server}"
            )
        return client

    def kubeconfig_for_user(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as `user` in `groups` by client certificate (no bindings)."""
        creds = self._client_ca.issue(user, organizations=groups)
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
        path = self.workdir / "users" / f"{safe_name}-{secrets.token_hex(4)}.kubeconfig"
        return _write_kubeconfig(path, self.server, self._server_ca_pem, user, creds)

    def own_kubeconfig(self, path: Path) -> Path:
        """path, if it is a kubeconfig this control plane wrote; otherwise ControlPlaneError."""
        resolved = path.resolve()
        if not resolved.is_relative_to(self.workdir.resolve()) or not resolved.is_file():
            raise ControlPlaneError(
                f"refusing {path}: not a kubeconfig written by this control plane"
            )
        return resolved


@contextlib.contextmanager
def running_control_plane(
    bin_dir: Path | None = None, extra_args: Mapping[str, Sequence[str]] | None = None
) -> Iterator[ControlPlane]:
    """Starts etcd, kube-apiserver and kube-controller-manager; on exit stops them, cleans up.

    extra_args: more flags per process name (a later flag overrides an earlier one), e.g. the
    scale benchmark's audit log and client rate limits."""
    bin_dir = bin_dir or tool_bin_dir()
    workdir = Path(tempfile.mkdtemp(prefix="gymkube-kube-"))
    processes: list[_Process] = []
    try:
        yield _start(bin_dir, workdir, processes, extra_args or {})
    finally:
        for process in reversed(processes):
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _start(
    bin_dir: Path, workdir: Path, processes: list[_Process], extra_args: Mapping[str, Sequence[str]]
) -> ControlPlane:
    started = time.monotonic()
    pki = workdir / "pki"
    etcd_port, etcd_peer_port, apiserver_port = _free_ports(3)
    server = f"https://127.0.0.1:{apiserver_port}"

    server_ca = _CertificateAuthority("gymkube-test-server-ca")
    client_ca = _CertificateAuthority("gymkube-test-client-ca")
    serving = server_ca.issue(
        "kube-apiserver",
        server_names=[
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())),
        ],
    )
    admin = client_ca.issue("gymkube-test-admin", organizations=["system:masters"])
    controller_manager = client_ca.issue("system:kube-controller-manager")
    service_account_key = ec.generate_private_key(_CURVE)
    files = {
        "server-ca.crt": server_ca.credentials.cert_pem,
        "client-ca.crt": client_ca.credentials.cert_pem,
        "client-ca.key": client_ca.credentials.key_pem,
        "apiserver.crt": serving.cert_pem,
        "apiserver.key": serving.key_pem,
        "admin.crt": admin.cert_pem,
        "admin.key": admin.key_pem,
        "service-account.key": _key_pem(service_account_key),
        "service-account.pub": service_account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    paths = {name: _write_private(pki / name, data) for name, data in files.items()}
    server_ca_pem = server_ca.credentials.cert_pem
    kubeconfig = _write_kubeconfig(
        workdir / "admin.kubeconfig", server, server_ca_pem, "gymkube-test-admin", admin
    )
    kcm_kubeconfig = _write_kubeconfig(
        workdir / "kube-controller-manager.kubeconfig",
        server,
        server_ca_pem,
        "system:kube-controller-manager",
        controller_manager,
    )

    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd_peer_url = f"http://127.0.0.1:{etcd_peer_port}"
    logs = workdir / "logs"
    logs.mkdir()

    def launch(name: str, *args: str) -> None:
        argv = [str(bin_dir / name), *args, *extra_args.get(name, ())]
        processes.append(_Process(name, argv, logs / f"{name}.log"))

    # All three start at once: the apiserver retries etcd and the controller-manager retries the
    # apiserver, so nothing waits for a predecessor to report ready.
    launch(
        "etcd",
        "--name=gymkube-test",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={etcd_peer_url}",
        f"--initial-advertise-peer-urls={etcd_peer_url}",
        f"--initial-cluster=gymkube-test={etcd_peer_url}",
        "--log-level=warn",
        # Throwaway data: skipping fsync keeps a loaded machine's disk out of every API call.
        "--unsafe-no-fsync",
    )
    launch(
        "kube-apiserver",
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={apiserver_port}",
        f"--cert-dir={workdir / 'apiserver'}",
        f"--tls-cert-file={paths['apiserver.crt']}",
        f"--tls-private-key-file={paths['apiserver.key']}",
        f"--client-ca-file={paths['client-ca.crt']}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={paths['service-account.pub']}",
        f"--service-account-signing-key-file={paths['service-account.key']}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
    )
    launch(
        "kube-controller-manager",
        f"--kubeconfig={kcm_kubeconfig}",
        # No serving port: nothing scrapes it, and it would be one more port to collide on.
        "--secure-port=0",
        "--leader-elect=false",
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={paths['service-account.key']}",
        f"--root-ca-file={paths['server-ca.crt']}",
        f"--cluster-signing-cert-file={paths['client-ca.crt']}",
        f"--cluster-signing-key-file={paths['client-ca.key']}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # With per-controller credentials every controller start costs a few API requests; the
        # default client limit (20 qps) spaces them out and delays startup by seconds.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    )

    tls = ssl.create_default_context(cafile=str(paths["server-ca.crt"]))
    tls.load_cert_chain(paths["admin.crt"], paths["admin.key"])

    def responds_ok(path: str) -> Callable[[], bool]:
        def probe() -> bool:
            try:
                with urllib.request.urlopen(f"{server}{path}", context=tls, timeout=5) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        return probe

    deadline = started + START_TIMEOUT_S
    _wait_for("kube-apiserver /readyz", responds_ok("/readyz"), processes, deadline)
    # The service-account controller creating `default` shows the controller-manager is up and
    # authorized; pods cannot be created in a namespace before its default service account exists.
    _wait_for(
        "the controller-manager to create the default service account",
        responds_ok("/api/v1/namespaces/default/serviceaccounts/default"),
        processes,
        deadline,
    )
    return ControlPlane(
        kubeconfig=kubeconfig,
        bin_dir=bin_dir,
        server=server,
        workdir=workdir,
        startup_seconds=time.monotonic() - started,
        _server_ca_pem=server_ca_pem,
        _client_ca=client_ca,
    )


def _wait_for(
    what: str, ready: Callable[[], bool], processes: list[_Process], deadline: float
) -> None:
    while not ready():
        for process in processes:
            process.check_running()
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}:\n{p.log_tail()}" for p in processes)
            raise ControlPlaneError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.1)
