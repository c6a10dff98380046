"""The builtin loop on the SDK with samples quarantined before the first step ($QUARANTINED,
comma-separated dataset indices): a straight run whose data never held them, which the data
rung's runs (test_data_rung.py) must equal."""

from __future__ import annotations

import os

from mpjob_trainer import session as mpjob
from mpjob_trainer.loop import train

with mpjob.start() as run:
    for index in os.environ["QUARANTINED"].split(","):
        run.quarantined.add(0, "data", [int(index)])
    train(run)
