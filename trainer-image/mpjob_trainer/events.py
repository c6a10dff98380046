"""JSON event lines on stdout: the trainer's log, and what `mpjob run` draws its view from.

The builtin trainer and every script on the SDK (mpjob_trainer.session) write the same lines.

One object per line, flushed, with an "event" key. Schema (camelCase; stable):
  start        attempt, precision, requestedPrecision, device, worldSize, startStep,
               totalSteps, metricsPort
  checkpointRejected  path, problem
  keepFp32     wrapped (module names), skipped (listed types autocast already runs in fp32)
  compile      mode (training.compile), compiled
  precisionMeasured  stepSeconds {precision: seconds | null}, chosen, ampSlowerThanFp32
  resume       step, path, sha256, fromPrecision
  freshStart   reason
  step         step, loss, lossScale (fp16 only), gradNorm, lr, overflowSteps,
               nonFiniteLosses, appliedSteps, samplesPerSecond, tokensPerSecond, mfu,
               stepSeconds, precision, peakDeviceMemoryBytes
  checkpointStaged  step, stallSeconds (the training thread's wait for a periodic save)
  checkpoint   step, path, sha256, seconds, bytes, async
  checkpointSkipped  step, why
  eval         step, loss, lossFp32, delta, seconds (the quality gate)
  fault        step, rule, message
  replay       verdict (precision|data|inconclusive), firstStep, steps, fromCheckpoint,
               offendingStep, samples, seconds
  replaySkipped  why
  repromote    step, cleanSteps
  preempted    step
  done         step, loss, appliedSteps
  error        kind, message
Only rank 0 writes step/checkpoint lines; every rank writes errors.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan; keep them readable
    return value


class EventLog:
    def __init__(self, rank: int = 0, stream: Any = None) -> None:
        self.rank = rank
        self.stream = stream or sys.stdout

    def __call__(self, event: str, *, all_ranks: bool = False, **fields: Any) -> None:
        if self.rank != 0 and not all_ranks:
            return
        record = {"event": event, "time": round(time.time(), 3)}
        record.update({k: _clean(v) for k, v in fields.items()})
        if self.rank:
            record["rank"] = self.rank
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()
