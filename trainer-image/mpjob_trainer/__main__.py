"""`mpjob-trainer` / `python -m mpjob_trainer`: run one attempt of a builtin or module task.

The attempt is described by an AttemptLaunch (mpjob_contract.launch) in the environment
variable MPJOB_LAUNCH or a file named by --launch. The session (mpjob_trainer.session) maps
how the run ends to the exit code and termination report of mpjob_contract.codes and
mpjob_contract.report; this entry point only parses, trains and returns that code.
"""

from __future__ import annotations

import argparse
import sys

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import LAUNCH_ENV
from mpjob_trainer import session
from mpjob_trainer.loop import train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpjob-trainer", description=__doc__)
    parser.add_argument("--launch", help=f"AttemptLaunch JSON file (default: ${LAUNCH_ENV})")
    args = parser.parse_args(argv)
    try:
        with session.start(launch=args.launch) as run:
            train(run)
    except SystemExit as exc:  # the session's ending: the report is already written
        return exc.code if isinstance(exc.code, int) else ExitCode.INFRA_ERROR
    return ExitCode.SUCCESS


if __name__ == "__main__":
    sys.exit(main())
