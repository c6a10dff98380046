"""The smallest job `mpjob run` trains: two steps of the builtin MLP on the CPU."""

from __future__ import annotations

from typing import Any


def tiny_job(name: str = "local") -> dict[str, Any]:
    """A MixedPrecisionJob manifest named `name` that trains two MLP steps, no GPU."""
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": name},
        "spec": {"task": {"builtin": "mlp"}, "training": {"steps": 2}, "resources": {"gpusPerWorker": 0}},
    }
