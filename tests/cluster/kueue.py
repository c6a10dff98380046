"""Kueue in the test cluster: its controller manager, built from the Go module pinned in
`kueue-build/go.mod` (by `build-kueue.sh`, cached by version), run as a local process beside
the control plane, with its CRDs and webhooks taken from that same module's source in the Go
module cache. Nothing prebuilt is downloaded.

Why a host process with URL webhooks: the API server must call Kueue's admission webhooks,
and in this cluster nothing routes a Service's ClusterIP to a process. Kueue listens on
127.0.0.1 (port base +85) with a serving certificate from this cluster's CA (`pki.py`), and
the webhook configurations name it by `clientConfig.url`; Kueue's own certificate management
is switched off. Only the webhooks of what this cluster runs are registered: Kueue's own
kinds and `batch/v1` Jobs, the latter only for Jobs that carry the queue-name label, so
unqueued Jobs (every other test and benchmark) never wait on Kueue nor fail while it is down.

Kueue is opt-in (`MPJOB_CLUSTER_KUEUE=1 make cluster`, `python -m tests.cluster up --kueue`),
and `start` adds it to a cluster that is already up: the Kueue e2e tests do that themselves,
so `make test` runs them without a flag while the other suites pay no controller's CPU.
It runs as a system:masters user of its own (`kueue`): its RBAC is not what is under test.

One wart: with its certificate management off, Kueue v0.14 reads a metrics serving
certificate from the fixed path /etc/kueue/metrics/certs before it looks at its config, and
exits without one, even with its metrics server off (as here). `write_credentials` puts a
certificate there when none is (root only; any certificate will do, nothing is served with it).
"""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.layout import REPO, ClusterError, Layout
from tests.cluster.pki import issue, write_kubeconfig

BUILD_SCRIPT = REPO / "tests" / "cluster" / "build-kueue.sh"
GO_MOD = REPO / "tests" / "cluster" / "kueue-build" / "go.mod"
NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
#: Webhooks of resources this cluster has; the rest (Ray, JobSet, Kubeflow, pods...) stay unregistered.
SERVED_GROUPS = {"batch", "kueue.x-k8s.io"}


def pinned_version() -> str:
    match = re.search(r"sigs\.k8s\.io/kueue (v\S+)", GO_MOD.read_text())
    if not match:
        raise ClusterError(f"no sigs.k8s.io/kueue version pinned in {GO_MOD}")
    return match.group(1)


def build() -> tuple[Path, Path]:
    """(bin directory holding `kueue`, the module's source directory): built and cached."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ClusterError(lines[-1] if lines else f"{BUILD_SCRIPT} failed")
    bin_dir, src = proc.stdout.strip().splitlines()[-2:]
    return Path(bin_dir), Path(src)


def write_credentials(layout: Layout) -> Path:
    """Kueue's client kubeconfig and its webhook serving certificate (tls.crt/tls.key); the cert dir."""
    issue(layout.pki, "kueue", "/O=system:masters/CN=kueue", client=True)
    issue(layout.pki, "kueue-webhook", "/CN=kueue-webhook", sans=["IP:127.0.0.1", "DNS:localhost"])
    write_kubeconfig(layout, kubeconfig(layout), "kueue")
    certs = layout.root / "kueue-certs"
    for folder in (certs, METRICS_CERTS):
        if folder == METRICS_CERTS and (folder / "tls.crt").exists():
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for src, dst in (("kueue-webhook.crt", "tls.crt"), ("kueue-webhook.key", "tls.key")):
                (folder / dst).write_bytes((layout.pki / src).read_bytes())
        except OSError as exc:
            raise ClusterError(f"Kueue needs a certificate in {folder} ({exc}); run as root or create it") from exc
    return certs


def kubeconfig(layout: Layout) -> Path:
    return layout.root / "kueue.kubeconfig"


def configuration(layout: Layout, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration: local ports, no leader election, no cert management, Jobs only."""
    p = layout.ports
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-health']}"},
        "metrics": {"bindAddress": "0"},  # off: nothing scrapes it here, and it would need a port
        "webhook": {"host": "127.0.0.1", "port": p["kueue-webhook"], "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def argv(layout: Layout, bin_dir: Path) -> list[str]:
    config = layout.root / "kueue-config.yaml"
    config.write_text(yaml.safe_dump(configuration(layout, write_credentials(layout))))
    return [
        str(bin_dir / "kueue"),
        f"--config={config}",
        f"--kubeconfig={kubeconfig(layout)}",
        # The visibility API server would bind a fixed port (8082) that two clusters share.
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    ]


def crds(src: Path) -> list[dict[str, Any]]:
    bases = src / "config" / "components" / "crd" / "bases"
    return [yaml.safe_load(p.read_text()) for p in sorted(bases.glob("*.yaml"))]


def webhook_configurations(layout: Layout, src: Path) -> list[dict[str, Any]]:
    """Kueue's webhook manifests, pointed at the local process by URL, trusted by this CA."""
    import base64

    ca = base64.b64encode((layout.pki / "ca.crt").read_bytes()).decode()
    base = f"https://127.0.0.1:{layout.ports['kueue-webhook']}"
    manifest = src / "config" / "components" / "webhook" / "manifests.yaml"
    out = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not doc:
            continue
        hooks = [h for h in doc["webhooks"] if {g for r in h["rules"] for g in r["apiGroups"]} <= SERVED_GROUPS]
        for hook in hooks:
            hook["clientConfig"] = {"url": base + hook["clientConfig"]["service"]["path"], "caBundle": ca}
            if any("batch" in r["apiGroups"] for r in hook["rules"]):
                hook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
        name = f"mpjob-test-kueue-{'mutating' if doc['kind'].startswith('Mutating') else 'validating'}"
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out


def kubectl_apply(bins: Path, layout: Layout, docs: list[dict[str, Any]]) -> None:
    """Server-side apply (Kueue's CRDs exceed the client-side apply annotation's size)."""
    cmd = [str(bins / "kubectl"), "--kubeconfig", str(layout.kubeconfig), "apply", "--server-side",
           "--force-conflicts", "--field-manager=mpjob-test-cluster", "-f", "-"]  # fmt: skip
    proc = subprocess.run(cmd, input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ClusterError(f"applying Kueue's manifests failed: {proc.stderr.strip()[-500:]}")


def install_crds(bins: Path, layout: Layout, src: Path) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kubectl_apply(bins, layout, [namespace, *crds(src)])
    cmd = [str(bins / "kubectl"), "--kubeconfig", str(layout.kubeconfig), "wait", "--for=condition=Established",
           "--timeout=60s", *[f"crd/{c['metadata']['name']}" for c in crds(src)]]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if proc.returncode != 0:
        raise ClusterError(f"Kueue's CRDs not established: {proc.stderr.strip()[-300:]}")


def ready(layout: Layout) -> bool:
    """Kueue's readiness probe answers 200 (its webhook server is listening with its cert)."""
    try:
        url = f"http://127.0.0.1:{layout.ports['kueue-health']}/readyz"
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False
