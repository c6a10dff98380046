"""Numbers read as text from outside (a pod's annotations, an HTTP header, the environment, a
tracking server's tags): ASCII digits only, one rule (`formats.whole_number`). `str.isdigit`
alone takes other scripts' digits, which int() then refuses with a ValueError its reader does
not expect: a reconcile or a trainer's start failed with a traceback where the reader refuses
the value in words."""

from __future__ import annotations

import pytest

from mpjob.controller.ownership import Malformed
from mpjob.controller.records import COMPLETION_INDEX, completion_index
from mpjob_contract.formats import whole_number
from mpjob_trainer.control import port_setting
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.launch.plan import LaunchConfigError, parse_plan

pytestmark = pytest.mark.unit
NOT_ASCII = ["\u00b2", "\u2460", "\uff11\uff12", "1\u00b2"]  # superscript two, circled one, full-width 12


@pytest.mark.parametrize(
    ("text", "number"),
    [("12", 12), ("0", 0), ("-1", None), (" 1", None), ("", None), ("1" * 19, None), ("9" * 5000, None)]
    + [(t, None) for t in NOT_ASCII],
)
def test_a_whole_number_is_ascii_digits_only_and_bounded(text: str, number: int | None) -> None:
    assert whole_number(text) == number


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_pods_completion_index_of_other_digits_is_not_read(text: str) -> None:
    assert completion_index({"annotations": {COMPLETION_INDEX: text}, "labels": {COMPLETION_INDEX: "1"}}) == 1
    with pytest.raises(Malformed, match="not a number"):
        completion_index({"annotations": {COMPLETION_INDEX: text}})


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_metrics_port_of_other_digits_is_a_configuration_error(text: str) -> None:
    with pytest.raises(ConfigError, match="MPJOB_METRICS_PORT"):
        port_setting("MPJOB_METRICS_PORT", text)


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_master_port_of_other_digits_is_a_launch_configuration_error(text: str) -> None:
    with pytest.raises(LaunchConfigError, match="MASTER_PORT"):
        parse_plan(["--", "python", "train.py"], {"MASTER_PORT": text})
