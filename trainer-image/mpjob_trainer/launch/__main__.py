"""`python -m mpjob_trainer.launch`: the same as the `mpjob-launch` console script."""

import sys

from mpjob_trainer.launch import main

sys.exit(main())
