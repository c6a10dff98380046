"""On the search path of the ranks a test's launcher starts (client.for_ranks): hands a rank
command to its warm-start server (tests/warm/standin.py) before this interpreter runs it."""

import os
import sys

if os.environ.get("MPJOB_WARM_DIR"):
    _REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path.insert(0, _REPO)
    try:
        from tests.warm import standin

        standin.main()
    finally:
        sys.path.remove(_REPO)
        for _name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
            del sys.modules[_name]
