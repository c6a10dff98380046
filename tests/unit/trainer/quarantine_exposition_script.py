"""The builtin loop on the SDK, then its own metrics endpoint read once before the session
closes (into $EXPOSITION): what the operator's live read of a trainer that skipped sees."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from mpjob_trainer import session as mpjob
from mpjob_trainer.loop import train

with mpjob.start() as run:
    train(run)
    port = os.environ["MPJOB_METRICS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        Path(os.environ["EXPOSITION"]).write_bytes(answer.read())
