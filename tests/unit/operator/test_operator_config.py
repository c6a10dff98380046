"""The operator's configuration (flags over MPJOB_* variables, made once), its peering rule and
its live-progress patch: the pure parts of mpjob.controller."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from mpjob.controller.config import OperatorConfig, Peering, from_environment
from mpjob.controller.main import liveness_endpoint, parser
from mpjob.controller.peering import outranked
from mpjob_contract.api import MixedPrecisionJobStatus
from tests.unit.operator.live_reads import progress_patch

pytestmark = pytest.mark.unit


def test_the_environment_gives_the_defaults_that_the_chart_and_benchmarks_set() -> None:
    env = {
        "MPJOB_TRAINER_IMAGE": "registry.example/trainer:1",
        "MPJOB_TRAINER_COMMAND": '["python", "-m", "mpjob_trainer"]',
        "MPJOB_TICK_SECONDS": "1",
        "MPJOB_MAX_TICKS_PER_SECOND": "50",
        "MPJOB_WORKERS": "4",
        "MPJOB_ATTEMPT_BACKOFF_SECONDS": "0.5",
    }
    config = from_environment(env)
    assert config == OperatorConfig(
        trainer_image="registry.example/trainer:1",
        trainer_command=("python", "-m", "mpjob_trainer"),
        tick_seconds=1.0,
        max_ticks_per_second=50.0,
        workers=4,
        attempt_backoff_seconds=0.5,
    )
    assert from_environment({}) == OperatorConfig()


class _Recording(dict[str, str]):
    """An empty environment that notes each variable asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default


def test_the_help_names_every_variable_the_flags_read_and_the_ports_defaults() -> None:
    environ = _Recording()
    text = " ".join(parser(environ).format_help().split())
    assert environ.asked, "the flags read the environment (the recording works)"
    assert {name for name in environ.asked if name not in text} == set()
    ports = ("--metrics-port PORT operator metrics", "default 8080)", "--health-port PORT", "default 8081)")
    assert [said for said in ports if said not in text] == []
    assert "-v, --verbose log at DEBUG" in text


def test_flags_win_over_the_environment() -> None:
    args = parser({"MPJOB_TICK_SECONDS": "1", "MPJOB_TRAINER_IMAGE": "a:1"}).parse_args(
        ["--tick-seconds", "3", "--trainer-image", "b:2", "-n", "team-a", "-n", "team-b"]
    )
    assert (args.tick_seconds, args.trainer_image, args.namespaces) == (3.0, "b:2", ["team-a", "team-b"])


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("0.0.0.0", "http://0.0.0.0:8081/healthz"),
        ("10.1.2.3", "http://10.1.2.3:8081/healthz"),
        ("::", "http://[::]:8081/healthz"),  # every interface of an IPv6 pod
        ("fd00:10:244::5", "http://[fd00:10:244::5]:8081/healthz"),  # the chart's podIP on an IPv6 cluster
    ],
)
def test_the_liveness_endpoint_listens_where_the_metrics_do(address: str, url: str) -> None:
    """kopf reads host and port from the URL: an IPv6 address must be bracketed, or the
    operator stops at start ('Port could not be cast to integer')."""
    assert liveness_endpoint(address, 8081) == url
    parsed = urlsplit(url)
    assert (parsed.hostname, parsed.port) == (address, 8081)
    assert liveness_endpoint(address, 0) is None


@pytest.mark.parametrize(
    ("env", "flag"),
    [
        ({"MPJOB_TICK_SECONDS": "0"}, "--tick-seconds"),
        ({"MPJOB_MAX_TICKS_PER_SECOND": "soon"}, "--max-ticks-per-second"),
        ({"MPJOB_WORKERS": "0"}, "--workers"),
        ({"MPJOB_TRAINER_COMMAND": "mpjob-trainer"}, "--trainer-command"),
        ({"MPJOB_ATTEMPT_BACKOFF_SECONDS": "-1"}, "--attempt-backoff-seconds"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_flag(
    env: dict[str, str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parser(env).parse_args([])
    assert f"argument {flag}:" in capsys.readouterr().err


NOW = datetime(2026, 1, 1, tzinfo=UTC)
ME = Peering(name="mpjob", identity="me", priority=10, clusterwide=True)


def peer(priority: int, seen_ago: float, lifetime: float = 60) -> dict[str, object]:
    return {"priority": priority, "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat(), "lifetime": lifetime}


@pytest.mark.parametrize(
    ("peers", "standby"),
    [
        ({}, False),
        ({"me": peer(99, 0)}, False),  # this replica's own entry
        ({"old": peer(5, 1)}, False),  # a lower priority acts only when alone
        ({"old": peer(10, 1)}, True),  # kopf pauses every peer of equal priority
        ({"old": peer(20, 1)}, True),
        ({"old": peer(20, 61)}, False),  # gone: its lifetime passed
        ({"old": None}, False),  # kopf empties a leaving peer's entry
    ],
)
def test_a_live_peer_of_equal_or_higher_priority_outranks_this_replica(peers: dict[str, object], standby: bool) -> None:
    assert outranked(peers, peering=ME, now=NOW) is standby


def running(**fields: object) -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {
            "phase": "Running",
            "precision": "fp16",
            "attempt": 0,
            "step": 10,
            "attempts": [{"index": 0, "precision": "fp16", "startStep": 0}],
            **fields,
        }
    )


def test_live_figures_are_written_only_when_they_changed() -> None:
    assert progress_patch(running(), {}) == {}
    assert progress_patch(running(), {"step": 10}) == {}
    assert progress_patch(running(), {"step": 20, "loss": 2.5}) == {"step": 20, "loss": 2.5}


def test_where_the_trainer_resumed_and_its_newest_checkpoint_reach_the_status() -> None:
    patch = progress_patch(running(), {"step": 210, "startStep": 200, "lastCheckpointStep": 200})
    assert patch["attempts"][-1]["startStep"] == 200
    assert patch["lastCheckpoint"] == {"step": 200, "precision": "fp16", "sha256": "", "path": ""}
    newer = running(lastCheckpoint={"step": 400, "precision": "fp16", "sha256": "ab", "path": "/c/400"})
    assert "lastCheckpoint" not in progress_patch(newer, {"lastCheckpointStep": 200})


def test_the_profile_key_comes_from_the_environment_only_and_is_never_shown() -> None:
    configured = from_environment({"MPJOB_PROFILE_KEY": "k3y-from-the-charts-secret"})
    assert configured.profile_key == b"k3y-from-the-charts-secret" and "k3y" not in repr(configured)
    drawn = from_environment({})
    assert len(drawn.profile_key) == 32 and drawn.profile_key != from_environment({}).profile_key
