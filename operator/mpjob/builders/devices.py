"""What a trainer pod is given of its node's GPUs: `resources.gpusPerWorker` of them, through the
device plugin, and no others.

The scheduler alone does not keep a pod that asks for no GPU from them: on a node whose container
runtime is NVIDIA's by default, an image that names its GPUs (NVIDIA_VISIBLE_DEVICES=all, which
the CUDA base images set, the trainer's among them) sees every GPU of the node. A CPU job's
trainer would then train on GPUs the scheduler gave other pods, uncharged (cost counts the GPUs a
pod asks for), with `auto` planned for a CPU. So a CPU job's pods name none, over the template's
env: NVIDIA_VISIBLE_DEVICES=void (the runtime acts as runc: no device, no driver) and
CUDA_VISIBLE_DEVICES empty (a process that still sees a device, a privileged pod's, leaves it be).
A GPU pod's list is the device plugin's to set.
"""

from __future__ import annotations

from typing import Any

from mpjob_contract.api import MixedPrecisionJobSpec

GPU_RESOURCE = "nvidia.com/gpu"


def trainer_resources(spec: MixedPrecisionJobSpec) -> dict[str, Any]:
    """The trainer container's requests and limits: the spec's, and its GPUs as a limit."""
    requests = {k: str(v) for k, v in spec.resources.requests.items()}
    limits = {k: str(v) for k, v in spec.resources.limits.items()}
    if spec.resources.gpus_per_worker > 0:
        limits[GPU_RESOURCE] = str(spec.resources.gpus_per_worker)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def device_env(spec: MixedPrecisionJobSpec) -> list[dict[str, Any]]:
    """The env that keeps a CPU job's trainer off the node's GPUs (none for a GPU job)."""
    if spec.resources.gpus_per_worker > 0:
        return []
    return [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "CUDA_VISIBLE_DEVICES", "value": ""}]
