"""On the search path of the ranks a test's launcher starts (client.for_ranks) and of the test
cluster's pods: hands a rank command, or the operator a chart's pod starts, to its warm-start
server (tests/warm/standin.py) before this interpreter runs it.

Every Python process under that launcher runs this (the launcher and `mpjob run` too), so what
is plainly no rank (`python -m` of another module, no script) leaves before any import;
standin.request decides the rest."""

import os
import sys


def _maybe_rank(argv: list) -> bool:
    """A rank, or the operator a chart's pod starts (`mpjob operator`)."""
    if len(argv) > 1 and argv[1].endswith("/mpjob"):
        return argv[2:3] == ["operator"]
    return len(argv) > 1 and (argv[1:3] == ["-m", "mpjob_trainer"] or argv[1].endswith((".py", "/mpjob-trainer")))


if os.environ.get("MPJOB_WARM_DIR") and _maybe_rank(sys.orig_argv):
    _REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path.insert(0, _REPO)
    try:
        from tests.warm import standin

        standin.main()
    finally:
        sys.path.remove(_REPO)
        for _name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
            del sys.modules[_name]
