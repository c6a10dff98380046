"""Names and limits of the trainer <-> operator contract that need no pydantic.

The per-pod launcher (mpjob-launch) starts on the standard library alone and loads pydantic
only when it must build a report, so the names it reads at start-up live here; `launch` and
`report` re-export them, one definition each.
"""

from __future__ import annotations

#: The environment variable that carries the AttemptLaunch JSON to the trainer.
LAUNCH_ENV = "MPJOB_LAUNCH"
#: Kubernetes' default terminationMessagePath; the trainer writes here unless told otherwise.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "MPJOB_TERMINATION_LOG"
#: Hard budget for the serialized report (Kubernetes truncates at 4096 bytes).
MAX_REPORT_BYTES = 3072
