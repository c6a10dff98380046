"""The trainer as the pod runs it (bench.gpu_trainer), asked for a profile on its metrics port
after its measured windows, as the operator asks for one: where its steps' time goes, from the
trace it writes below its checkpoint folder (bench.gpu_profile reads it). The compile, the
warm-up and the final save are outside the captured steps.
"""

from __future__ import annotations

import gzip
import json
import secrets
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench.gpu_profile import trace_breakdown
from bench.gpu_setup import Figures, Setup
from bench.gpu_trainer import TRAINER, job_spec, process_env, trainer_figures
from mpjob_contract.codes import ExitCode
from mpjob_contract.tracking import (
    FINAL_STATES,
    MAX_ANSWER_BYTES,
    MAX_RAW_TRACE_BYTES,
    PROFILE_PATH,
    PROFILE_TOKEN_ENV,
    TRACE_FILE,
    ProfileAnswer,
    profile_dir,
)

#: The profile a profiled run asks for: its id, and the steps it captures.
PROFILE_ID, PROFILE_STEPS = 1, 10
#: The steps a profiled run may train past its measured ones: it is stopped once its profile is
#: written (asked at a log line, captured, exported and compressed on a thread of its own).
PROFILE_ROOM = 1000


def ask_profile(port: int, token: str, steps: int) -> ProfileAnswer:
    """Ask the trainer on its metrics port for a profile of `steps` steps, as the operator does."""
    url = f"http://127.0.0.1:{port}{PROFILE_PATH}?id={PROFILE_ID}&steps={steps}"
    request = urllib.request.Request(url, method="POST", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return ProfileAnswer.model_validate_json(response.read(MAX_ANSWER_BYTES))


def written_trace(checkpoint_dir: str) -> dict[str, Any] | None:
    """The trace of PROFILE_ID the trainer wrote below its checkpoint folder (None: none)."""
    path = Path(profile_dir(checkpoint_dir, PROFILE_ID)) / TRACE_FILE
    if not path.exists():
        return None
    with gzip.open(path, "rb") as f:
        return json.loads(f.read(MAX_RAW_TRACE_BYTES))


def profiled_run(setup: Setup, label: str, steps: int = PROFILE_STEPS) -> tuple[list[dict[str, Any]], dict | None, str]:
    """trainer_run, asked for a profile of `steps` steps once its line of step `setup.steps`
    (the measured windows' last) is read, and stopped (SIGTERM, as a pod is) once the profile
    is written or failed: the run is long enough that it never ends first. Its events, the
    trace (None: not written) and what became of the profile (the trainer's last answer)."""
    spec = job_spec(setup, label, steps=setup.steps + PROFILE_ROOM, log_every=setup.log_every)
    token, events, port, answer = secrets.token_urlsafe(16), [], None, None
    with tempfile.TemporaryDirectory() as tmp, open(f"{tmp}/stderr", "w+") as err:
        served = {"MPJOB_METRICS_PORT": "0", "MPJOB_METRICS_HOST": "127.0.0.1", PROFILE_TOKEN_ENV: token}
        env = process_env(spec, label, tmp, **served)
        with subprocess.Popen(TRAINER, env=env, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
            assert proc.stdout is not None
            for event in map(json.loads, (line for line in proc.stdout if line.startswith("{"))):
                events.append(event)
                port = event.get("metricsPort", port) if event["event"] == "start" else port
                if event["event"] == "step" and event["step"] >= setup.steps and port:
                    answer = ask_profile(port, token, steps)  # asked again: what became of it
                    if answer.state in FINAL_STATES:
                        proc.send_signal(signal.SIGTERM)
                        port = None
        if proc.returncode not in (0, ExitCode.PREEMPTED):
            err.seek(0)
            raise RuntimeError(f"trainer {label} exited {proc.returncode}:\n{err.read()[-3000:]}")
        said = f"{answer.state}: {answer.message}" if answer and answer.message else (answer and answer.state)
        return events, written_trace(f"{tmp}/ckpt"), said or "never asked: no metrics port"


def profiled_figures(setup: Setup, label: str) -> tuple[Figures, dict[str, Any]]:
    """A profiled run's figures (its measured windows) and where its steps' time went (or
    {"precision", "unavailable": why} when its profile was not written)."""
    events, trace, said = profiled_run(setup, label)
    figures = trainer_figures(events, setup.warmup, last=setup.steps)
    if trace is None:
        return figures, {"precision": label, "unavailable": said}
    return figures, trace_breakdown(trace, steps=captured_steps(events), step_s=figures.step_s, label=label)


def captured_steps(events: list[dict[str, Any]]) -> int:
    """The steps the profile captured, from the trainer's `profile` event (PROFILE_STEPS if none)."""
    said = [e["steps"] for e in events if e["event"] == "profile" and e.get("id") == PROFILE_ID]
    return said[-1] if said else PROFILE_STEPS


def step_breakdown(setup: Setup, label: str = "bf16") -> dict[str, Any]:
    """Where the time of `label`'s steps goes (bench.gpu_profile), from a profiled run of the
    trainer as the pod runs it."""
    return profiled_figures(setup, label)[1]
