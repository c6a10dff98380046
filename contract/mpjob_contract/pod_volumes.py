"""The volumes the operator adds to every trainer pod, named once for the pod builder
(mpjob.builders.attempt) and for the rules (mpjob_contract.pod_rules) that keep the template's
own volumes and mounts from colliding with them.

Light on purpose (no pydantic, no API models): `launch` re-exports CHECKPOINT_MOUNT from here,
and the rules, which the API models import, read these names too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The operator's checkpoint volume, in every trainer pod, and where the trainer container mounts it.
CHECKPOINT_VOLUME, CHECKPOINT_MOUNT = "checkpoints", "/var/lib/mpjob/checkpoints"
#: GPU pods get a memory-backed /dev/shm (a container's default is 64 MiB): DataLoader workers
#: hand batches over in shared memory and NCCL's intra-node transport lives there.
SHM_VOLUME, SHM_MOUNT = "dshm", "/dev/shm"
#: The most volumes and volume mounts a template may add, and the longest mountPath (Linux's
#: PATH_MAX). Not the pod API's bounds (it has none): the API server estimates a CEL rule's cost
#: from the largest list and string a schema allows, and the rule that looks up every mount's
#: volume fits its budget only with these bounds. Far above what a trainer pod uses.
MAX_TEMPLATE_VOLUMES, MAX_TEMPLATE_VOLUME_MOUNTS, MAX_MOUNT_PATH = 256, 256, 4096


def adds_shared_memory(gpus: int, mounts: Sequence[Mapping[str, Any]], volumes: Sequence[Mapping[str, Any]]) -> bool:
    """Does the operator add its /dev/shm volume to the pod? GPU pods get it, unless the
    template mounts its own there or names a volume like ours (the user's wins; we never
    shadow it)."""
    taken = any(m.get("mountPath") == SHM_MOUNT for m in mounts) or any(v.get("name") == SHM_VOLUME for v in volumes)
    return gpus > 0 and not taken
