"""The quick tier (`make test-fast`: unit and not process) starts no trainer: a test here that
starts a local run's trainer launchers without the `process` marker fails, naming the marker (a
test that puts a stand-in in the launcher's place, as test_out_links does, starts none)."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.localrun import workers


@pytest.fixture(autouse=True)
def trainers_only_in_process_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("process") is not None:
        return

    def refused(*args: Any, **kwargs: Any) -> list[str]:
        raise AssertionError(f"{request.node.nodeid} starts trainer processes: mark it @pytest.mark.process")

    monkeypatch.setattr(workers, "launcher_argv", refused)
