"""Live progress: a running attempt's figures (step, loss, loss scale, overflow steps,
throughput, where it resumed, its last good checkpoint), read from rank 0's Prometheus endpoint
(the one Prometheus scrapes; the trainer holds no Kubernetes token), and the status patch
that records them.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mpjob.controller import metrics as om
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobStatus

#: status field <- the trainer's metric, and the type the status holds it as.
FIGURES: tuple[tuple[str, str, Callable[[float], Any]], ...] = (
    ("step", tm.STEP, int),
    ("loss", tm.LOSS, float),
    ("lossScale", tm.LOSS_SCALE, float),
    ("overflowSteps", tm.OVERFLOW_STEPS + "_total", int),
    ("samplesPerSecond", tm.SAMPLES_PER_SECOND, float),
)


def scrape_progress(ip: str, *, timeout: float) -> dict[str, Any]:
    """Rank 0's figures by their status field names (plus startStep and lastCheckpointStep when
    known); empty when the endpoint cannot be read."""
    url = f"http://{ip}:{tm.DEFAULT_METRICS_PORT}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
    except OSError:
        om.SCRAPE_FAILURES.inc()
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    found: dict[str, Any] = {key: cast(values[metric]) for key, metric, cast in FIGURES if metric in values}
    if tm.START_STEP in values:
        found["startStep"] = int(values[tm.START_STEP])
    if tm.LAST_GOOD_CHECKPOINT_STEP in values and values[tm.LAST_GOOD_CHECKPOINT_STEP] > 0:
        found["lastCheckpointStep"] = int(values[tm.LAST_GOOD_CHECKPOINT_STEP])
    return found


def progress_patch(status: MixedPrecisionJobStatus, found: dict[str, Any]) -> dict[str, Any]:
    """The status fields to write for the figures `found`; empty when nothing changed."""
    patch: dict[str, Any] = {k: v for k, v in found.items() if k not in ("lastCheckpointStep", "startStep")}
    if "startStep" in found and status.attempts and status.attempts[-1].start_step != found["startStep"]:
        # The trainer decides where it resumes (the newest valid checkpoint): record that.
        attempts = [a.to_api() for a in status.attempts]
        attempts[-1]["startStep"] = found["startStep"]
        patch["attempts"] = attempts
    if "lastCheckpointStep" in found and (
        not status.last_checkpoint or status.last_checkpoint.step < found["lastCheckpointStep"]
    ):
        patch["lastCheckpoint"] = {
            "step": found["lastCheckpointStep"],
            "precision": status.precision or "",
            "sha256": "",
            "path": "",
        }
    current = status.to_api()
    return patch if any(current.get(k) != v for k, v in patch.items()) else {}
