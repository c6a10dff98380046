"""Bad manifests, each with the field its error must name: shared by the `mpjob validate`
table test and the API-server table test, so both reject the same inputs."""

from __future__ import annotations

import copy
from typing import Any

GOOD: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "ok"},
    "spec": {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}},
}


def bad(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    node = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return doc


# (id, manifest, text the error must contain)
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-field", bad("spec.precision.turbo", True), "turbo"),
    ("bad-mode", bad("spec.precision.mode", "fp8"), "spec.precision.mode"),
    ("duplicate-fallback", bad("spec.precision.fallback", ["bf16", "bf16"]), "fallback"),
    ("builtin-and-module", bad("spec.task", {"builtin": "gpt", "module": "a.b:c"}), "exactly one of task.builtin"),
    ("neither-task", bad("spec.task", {"args": {}}), "exactly one of task.builtin"),
    ("module-and-command", bad("spec.task", {"module": "a.b:c", "command": ["python", "t.py"]}), "task.command"),
    ("empty-command", bad("spec.task", {"command": []}), "spec.task.command"),
    ("working-dir-without-command", bad("spec.task", {"builtin": "gpt", "workingDir": "/app"}), "task.workingDir"),
    ("zero-processes", bad("spec.resources.processesPerWorker", 0), "processesPerWorker"),
    ("zero-workers", bad("spec.workers", 0), "spec.workers"),
    ("negative-steps", bad("spec.training.steps", -5), "spec.training.steps"),
    ("bad-module-path", bad("spec.task", {"module": "not a module"}), "spec.task.module"),
    ("bad-capability", bad("spec.resources.minComputeCapability", "eight"), "minComputeCapability"),
    (
        "two-volumes",
        bad("spec.checkpoint.volume", {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "x"}}),
        "exactly one of checkpoint.volume",
    ),
    ("long-name", bad("metadata.name", "x" * 51), "50"),
    ("backoff-above-one", bad("spec.precision.lossScale.backoffFactor", 1.5), "backoffFactor"),
]
