"""What rank 0 does beside training, each off the training thread where it can: serving the
metrics port (with the operator's profile requests on it), experiment tracking
(mpjob_trainer.tracking) and profiles on demand (mpjob_trainer.profiling). Other ranks serve
nothing and track nothing; their hooks cost nothing."""

from __future__ import annotations

import os

import torch

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.tracking import PROFILE_TOKEN_ENV
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.profiling import ProfileCapture
from mpjob_trainer.profiling.places import place_of
from mpjob_trainer.session.attempt import config_digest
from mpjob_trainer.tracking import RunTracker, track


class Instruments:
    def __init__(
        self, launch: AttemptLaunch, *, world: World, device: torch.device, log: EventLog, metrics: TrainerMetrics
    ) -> None:
        self.profiles: ProfileCapture | None = None
        self.tracker: RunTracker | None = None
        if not world.is_main:
            return
        self.profiles = ProfileCapture(place_of(launch), device=device, log=log, metrics=metrics)
        metrics.serve(self.profiles.ask, os.environ.get(PROFILE_TOKEN_ENV) or None)
        self.tracker = track(launch, rank0=True, digest=config_digest(launch), metrics=metrics, log=log)
        if self.tracker is not None:
            log.listeners.append(self.tracker)

    def step(self, step: int) -> None:
        """Optimizer step `step` ended (every step: one attribute read while nothing is asked)."""
        if self.profiles is not None:
            self.profiles.step(step)

    def close(self, step: int, code: int) -> None:
        """The attempt ended with exit `code`: keep a capture's steps, end the tracked run."""
        if self.profiles is not None:
            self.profiles.close(step)
        if self.tracker is not None:
            self.tracker.close(code)
