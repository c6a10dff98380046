"""A script that raises: the attempt's message names the exception and where the user's own code
raised it (the innermost frame outside torch and the trainer), bounded in length."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from mpjob_contract.codes import ExitCode
from mpjob_trainer.session.ending import MAX_ERROR_CHARS, MAX_PLACE_CHARS, Standing, classify

pytestmark = pytest.mark.unit
HERE = "tests/unit/trainer/test_script_errors.py"


def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(batch["inputs"], batch["labels"])  # raises inside torch's own code


def caught(call: object, *args: object) -> BaseException:
    try:
        call(*args)  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("it did not raise")


def line_of(func: object, text: str) -> int:
    lines, first = inspect.getsourcelines(func)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_key_error_names_the_users_line() -> None:
    ending = classify(caught(loss_of, {"inputs": torch.zeros(2, 3)}), Standing())
    assert ending.code == ExitCode.INFRA_ERROR
    assert ending.message == f"KeyError: 'labels' (raised at {HERE}:{line_of(loss_of, 'F.cross_entropy')} in loss_of)"


def test_an_error_raised_inside_torch_names_the_users_call_not_torchs_frame() -> None:
    batch = {"inputs": torch.zeros(2, 3), "labels": torch.zeros(5, dtype=torch.long)}
    message = classify(caught(loss_of, batch), Standing()).message
    assert message.startswith("ValueError: ") and "functional.py" not in message, message
    assert message.endswith(f"(raised at {HERE}:{line_of(loss_of, 'F.cross_entropy')} in loss_of)"), message


def test_a_long_error_is_cut_and_keeps_its_place() -> None:
    def shout() -> None:
        raise RuntimeError("x" * 50_000)

    message = classify(caught(shout), Standing()).message
    assert len(message) <= len("RuntimeError: ") + MAX_ERROR_CHARS + len(" [...] (raised at )") + MAX_PLACE_CHARS
    assert message.endswith(f"(raised at {HERE}:{line_of(shout, 'raise RuntimeError')} in shout)"), message[-200:]


def test_an_error_without_a_frame_of_the_users_is_the_exception_alone() -> None:
    assert classify(RuntimeError("boom"), Standing()).message == "RuntimeError: boom"
