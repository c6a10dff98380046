"""A stand-in rank for launcher tests: `rank.py OUT BEHAVIOUR_OF_LOCAL_RANK_0 BEHAVIOUR_1 ...`.

Standard library only (starts in milliseconds). Every behaviour first writes OUT/ready-<RANK>
(its pid) so a test can wait for it. Behaviours:
  env           dump the environment to OUT/env-<RANK>.json and exit 0
  wait          wait for SIGTERM, then write a Preempted report (step 7, its checkpoint) and exit 44
  stubborn      ignore SIGTERM and wait forever (the launcher must SIGKILL it)
  config-error  write a ConfigError report and exit 43
  exit:N        exit N without a report
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def report(reason: str, message: str, **extra: object) -> None:
    Path(os.environ["MPJOB_TERMINATION_LOG"]).write_text(json.dumps({"reason": reason, "message": message, **extra}))


def main() -> int:
    out, behaviours = Path(sys.argv[1]), sys.argv[2:]
    rank, local = os.environ["RANK"], int(os.environ["LOCAL_RANK"])
    behaviour = behaviours[local]
    if behaviour == "wait":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(preempted(rank)))
    elif behaviour == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / f"ready-{rank}").write_text(str(os.getpid()))
    if behaviour == "env":
        (out / f"env-{rank}.json").write_text(json.dumps(dict(os.environ)))
        return 0
    if behaviour == "config-error":
        report("ConfigError", f"rank {rank}: cannot read its data shard")
        return 43
    if behaviour.startswith("exit:"):
        return int(behaviour.removeprefix("exit:"))
    while True:
        signal.pause()


def preempted(rank: str) -> int:
    checkpoint = {"step": 7, "path": "/ckpt/step-7", "sha256": "ab", "precision": "fp32"}
    report("Preempted", f"rank {rank} stopped", step=7, lastGoodCheckpoint=checkpoint)
    return 44


if __name__ == "__main__":
    sys.exit(main())
