"""The control plane's binaries: prebuilt ones named by $KUBEBUILDER_ASSETS, else those
`build.sh` builds from the versions pinned in `build/*/go.mod` (cached outside git)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cluster.layout import REPO, ClusterError


def binaries() -> Path:
    """The directory holding etcd, kube-* binaries (and kubectl, helm): built and cached."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        path = Path(assets)
        missing = [b for b in ("etcd", "kube-apiserver") if not (path / b).exists()]
        if missing:
            raise ClusterError(f"KUBEBUILDER_ASSETS={assets} lacks {', '.join(missing)}; unset it to build them")
        return path
    build = REPO / "tests" / "cluster" / "build.sh"
    proc = subprocess.run(["bash", str(build)], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ClusterError(lines[-1] if lines else "tests/cluster/build.sh failed")
    return Path(proc.stdout.strip().splitlines()[-1])
