"""Names and limits of the trainer <-> operator contract that need no pydantic.

The per-pod launcher (mpjob-launch) starts on the standard library alone and loads pydantic
only when it must build a report, so the names it reads at start-up live here; `launch` and
`report` re-export them, one definition each.
"""

from __future__ import annotations

import re

#: The environment variable that carries the AttemptLaunch JSON to the trainer.
LAUNCH_ENV = "MPJOB_LAUNCH"
#: The UID of the Job a trainer pod runs in (the Job controller's pod label, by the downward
#: API): what the checkpoints it writes name as their writer (AttemptLaunch.lineage). Unset: none.
ATTEMPT_JOB_ENV = "MPJOB_ATTEMPT_JOB_UID"
#: A folder on the pod's own disk for the trainer's private scratch: the local spool of a job
#: whose checkpoints (and profiles) go to a bucket. The operator names the checkpoint volume's
#: emptyDir, which such a job leaves unused; unset (`mpjob run`), the system's temporary folder.
SCRATCH_ENV = "MPJOB_SCRATCH_DIR"
#: Kubernetes' default terminationMessagePath; the trainer writes here unless told otherwise.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "MPJOB_TERMINATION_LOG"
#: Hard budget for the serialized report (Kubernetes truncates at 4096 bytes).
MAX_REPORT_BYTES = 3072
#: Colour and cursor codes (CSI sequences, ESC [ ... final byte): dropped whole from a message.
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: Any other control character but a newline or a tab (C0, DEL, C1): shown as U+FFFD.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def readable(text: str) -> str:
    """A message the tenant's process wrote, safe for whoever reads it in a terminal (the status,
    its Events, `mpjob status`): no escape sequence, no carriage return; its lines kept."""
    return _CONTROL.sub("\ufffd", _CSI.sub("", text.replace("\r\n", "\n")))
