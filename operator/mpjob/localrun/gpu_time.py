"""GpuTime: what a local run's attempts are charged in GPU-seconds (mpjob.planning.cost): the
GPUs their trainers ran on, as the start line names every process's device (local workers share
the machine's GPUs; with processesPerWorker above 1 each local rank may hold another), times
the wall time each attempt ran here."""

from __future__ import annotations

import time

from mpjob.planning import cost
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec


class GpuTime:
    def __init__(self, spec: MixedPrecisionJobSpec) -> None:
        self.spec = spec
        #: GPU-seconds of each attempt run here, by attempt index (cost.account reads it).
        self.seconds: dict[int, float] = {}
        self._devices: set[str] = set()  # the devices the current attempt's start lines named
        self._workers = spec.workers
        self._began = 0.0

    def begin(self, workers: int) -> None:
        """An attempt of `workers` local workers starts now: nothing of it is seen yet."""
        self._workers, self._began, self._devices = workers, time.monotonic(), set()

    def seen(self, event: events.TrainerEvent) -> None:
        """A trainer line: a start line names the devices its processes train on."""
        if isinstance(event, events.Start):
            self._devices |= set(event.every_device)

    def charge(self, index: int) -> None:
        """Attempt `index` ran from its start (or its last charge) to now."""
        now = time.monotonic()
        self.seconds[index] = self.gpus(self._workers) * (now - self._began)
        self._began = now

    def charge_seen(self, index: int, workers: int, seconds: float) -> None:
        """Attempt `index`, of `workers`, ran `seconds` as its lines tell (a killed runner's)."""
        self.seconds[index] = self.gpus(workers) * seconds

    def gpus(self, workers: int) -> int:
        return cost.gpus_held(self.spec, workers, self._devices)
