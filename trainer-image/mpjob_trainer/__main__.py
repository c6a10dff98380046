"""`mpjob-trainer` / `python -m mpjob_trainer`: run one attempt and exit with its code.

The attempt is described by an AttemptLaunch (mpjob_contract.launch) in the environment
variable MPJOB_LAUNCH or a file named by --launch. Exit codes and the termination report
follow mpjob_contract.codes and mpjob_contract.report.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback

from pydantic import ValidationError

from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch
from mpjob_contract.report import Counters, TerminationReport
from mpjob_trainer.distributed import shutdown, world_from_env
from mpjob_trainer.errors import ConfigError, NumericFault, Preempted
from mpjob_trainer.events import EventLog
from mpjob_trainer.loop import Trainer


def read_launch(path: str | None) -> AttemptLaunch:
    if path:
        try:
            text = open(path).read()  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"--launch {path}: {exc.strerror}") from exc
    else:
        text = os.environ.get(LAUNCH_ENV, "")
        if not text:
            raise ConfigError(f"no attempt description: set {LAUNCH_ENV} or pass --launch FILE")
    try:
        return AttemptLaunch.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid attempt description: {problems}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpjob-trainer", description=__doc__)
    parser.add_argument("--launch", help=f"AttemptLaunch JSON file (default: ${LAUNCH_ENV})")
    args = parser.parse_args(argv)
    world = world_from_env()
    log = EventLog(world.rank)
    trainer: Trainer | None = None

    def report(reason: Reason, message: str) -> None:
        store = trainer.store if trainer else None
        counters = dict(trainer.counters) if trainer else {}
        TerminationReport(
            reason=reason,
            step=trainer.step if trainer else 0,
            start_step=trainer.start_step if trainer else 0,
            precision=trainer.precision if trainer else "",
            last_good_checkpoint=store.last_good if store else None,
            counters=Counters.model_validate(counters),
            message=message,
        ).write()

    code: int
    try:
        launch = read_launch(args.launch)
        trainer = Trainer(launch, log)
        result = trainer.run()
        report(Reason.SUCCEEDED, f"trained {result.step} steps in {result.precision}")
        code = ExitCode.SUCCESS
    except ConfigError as exc:
        log("error", kind="ConfigError", message=str(exc), all_ranks=True)
        report(Reason.CONFIG_ERROR, str(exc))
        code = ExitCode.CONFIG_ERROR
    except NumericFault as exc:
        report(Reason.NUMERIC_FAULT, f"{exc.rule}: {exc}")
        code = ExitCode.NUMERIC_FAULT
    except Preempted as exc:
        report(Reason.PREEMPTED, str(exc))
        code = ExitCode.PREEMPTED
    except Exception as exc:
        traceback.print_exc()
        log("error", kind=type(exc).__name__, message=str(exc), all_ranks=True)
        report(Reason.INFRA_ERROR, f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        with contextlib.suppress(Exception):
            shutdown(world)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
