"""`python paced_script.py SCRIPT [ARGS...]`: SCRIPT run as `__main__` with ARGS, each step of any
torch optimizer it makes first sleeping $PACED_STEP_SECONDS (none: not paced).

For your own code (an example) what task.args.stepDelay is for a builtin task: a run that a test
stops mid-way lasts by the clock, however late a starved test acts. The pace is in the
environment, not the command, which checkpoints' config digest names: the runs that resume the
paced one's checkpoints, and the straight run they are compared with, run the same command unpaced.
"""

from __future__ import annotations

import os
import runpy
import sys
import time

from torch.optim.optimizer import register_optimizer_step_pre_hook


def main() -> None:
    seconds = float(os.environ.get("PACED_STEP_SECONDS", "0"))
    if seconds:
        register_optimizer_step_pre_hook(lambda *_: time.sleep(seconds))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
