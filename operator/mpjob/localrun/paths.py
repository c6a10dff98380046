"""Where a local run keeps its files: --out's folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Paths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def series(self) -> Path:
        return self.root / "series.json"

    @property
    def plot(self) -> Path:
        return self.root / "training.png"

    def attempt(self, index: int) -> Path:
        return self.root / "attempts" / f"a{index}"
