"""The cluster's certificates and kubeconfigs, made once with openssl and kept in `pki/`.

One CA signs the apiserver's serving certificate and a client certificate per user: the
admin (system:masters), the controller-manager and the scheduler, whose names RBAC's
bootstrap roles bind. `sa.key`/`sa.pub` sign and check ServiceAccount tokens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cluster.layout import ClusterError, Layout

DAYS = "3650"
APISERVER_SANS = [
    "IP:127.0.0.1",
    "IP:10.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
]
USERS = ("admin", "controller-manager", "scheduler")


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def check_openssl() -> None:
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        raise ClusterError("openssl is missing; install it (apt-get install openssl)")


def issue(pki: Path, name: str, subject: str, *, sans: list[str] | None = None, client: bool = False) -> None:
    """A key and a certificate signed by the CA (kept if it exists)."""
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    if crt.exists():
        return
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject)
    ext = pki / f"{name}.ext"
    usage = "clientAuth" if client else "serverAuth,clientAuth"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", f"extendedKeyUsage={usage}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    ca, ca_key = str(pki / "ca.crt"), str(pki / "ca.key")
    _openssl("x509", "-req", "-in", str(csr), "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", str(crt),
             "-days", DAYS, "-sha256", "-extfile", str(ext))  # fmt: skip


def ensure_pki(layout: Layout) -> None:
    """The CA, the certificates and the ServiceAccount key pair (only what is missing)."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / "ca.key"),
                 "-out", str(pki / "ca.crt"), "-days", DAYS, "-subj", "/CN=mpjob-test-ca")  # fmt: skip
    issue(pki, "apiserver", "/CN=kube-apiserver", sans=APISERVER_SANS)
    issue(pki, "admin", "/O=system:masters/CN=mpjob-admin", client=True)
    issue(pki, "controller-manager", "/CN=system:kube-controller-manager", client=True)
    issue(pki, "scheduler", "/CN=system:kube-scheduler", client=True)
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def kubeconfig_path(layout: Layout, user: str) -> Path:
    """The admin's is `kubeconfig` (the one users export); the components' are named for them."""
    return layout.kubeconfig if user == "admin" else layout.root / f"{user}.kubeconfig"


def write_kubeconfig(layout: Layout, path: Path, user: str) -> None:
    pki = layout.pki
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: mpjob-test
  cluster: {{server: "{layout.server}", certificate-authority: "{pki / "ca.crt"}"}}
users:
- name: {user}
  user: {{client-certificate: "{pki / (user + ".crt")}", client-key: "{pki / (user + ".key")}"}}
contexts:
- name: mpjob-test
  context: {{cluster: mpjob-test, user: {user}, namespace: default}}
current-context: mpjob-test
"""
    )


def write_credentials(layout: Layout) -> None:
    """Everything the components and the admin authenticate with."""
    ensure_pki(layout)
    for user in USERS:
        write_kubeconfig(layout, kubeconfig_path(layout, user), user)
