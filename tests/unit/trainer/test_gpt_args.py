"""The `gpt` task's vocabulary and synthetic-token arguments (vocabSize, data, samples): the
vocabulary reaches the model, random data is seeded and in range, bad values name the field,
and a job that sets none of them trains the model it always did."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.codes import ExitCode
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.tasks.gpt import make_task
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit
SMALL = {"nLayer": 1, "nHead": 2, "nEmbd": 16, "blockSize": 8}


def test_vocab_size_reaches_the_embedding_and_the_tied_lm_head() -> None:
    task = make_task({**SMALL, "vocabSize": 1000})
    model: Any = task.model
    assert model.wte.weight.shape == (1000, 16)
    assert model.lm_head.weight.shape == (1000, 16)
    assert model.wte.weight is model.lm_head.weight
    inputs, _ = task.dataset[0]
    assert model(inputs[None]).shape == (1, 8, 1000)


def test_without_the_new_args_the_model_and_data_are_the_bytes_of_before() -> None:
    task = make_task(dict(SMALL))
    model: Any = task.model
    assert model.lm_head.weight.shape[0] == 256
    inputs, targets = task.dataset[0]
    assert torch.equal(inputs[1:], targets[:-1]) and int(inputs.max()) < 256


def test_flops_per_sample_counts_as_nanogpt_does() -> None:
    """6N + 12 L H Q T per token, N without the position embedding, times T tokens."""
    args = {**SMALL, "vocabSize": 512}
    task = make_task(args)
    model: Any = task.model
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    per_token = 6 * n + 12 * 1 * 2 * (16 // 2) * 8
    assert task.flops_per_sample == per_token * 8
    assert task.tokens_per_sample == 8


def test_random_data_covers_the_vocabulary_and_stays_in_range() -> None:
    task = make_task({**SMALL, "vocabSize": 50304, "data": "random", "samples": 300})
    assert len(task.dataset) == 300  # type: ignore[arg-type]
    windows = torch.stack([torch.cat([x, y[-1:]]) for x, y in (task.dataset[i] for i in range(300))])
    assert windows.dtype == torch.int64
    assert int(windows.min()) >= 0 and int(windows.max()) < 50304
    assert int(windows.max()) > 50304 // 2  # drawn over the whole vocabulary, not bytes
    inputs, targets = task.dataset[7]
    assert inputs.shape == targets.shape == (8,) and torch.equal(inputs[1:], targets[:-1])


def test_random_data_is_the_same_in_every_process_and_held_out_differs() -> None:
    args = {**SMALL, "vocabSize": 4096, "data": "random", "samples": 16}
    first, second = make_task(dict(args)), make_task(dict(args))
    for i in range(16):
        assert torch.equal(first.dataset[i][0], second.dataset[i][0])
    assert first.eval_dataset is not None
    assert not torch.equal(first.eval_dataset[0][0], first.dataset[0][0])


@pytest.mark.parametrize("data", ["text", "random"])
def test_the_eval_set_is_valid_for_a_bigger_vocabulary(data: str) -> None:
    task = make_task({**SMALL, "vocabSize": 700, "data": data})
    assert task.eval_dataset is not None
    inputs, targets = task.eval_dataset[0]
    assert int(torch.cat([inputs, targets]).max()) < 700
    loss = task.loss(task.model(inputs[None]), targets[None])
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"vocabSize": 255}, r"task\.args\.vocabSize: expected an integer >= 256"),
        ({"vocabSize": "big"}, r"task\.args\.vocabSize: expected int, got 'big'"),
        ({"nLayer": 2.7}, r"task\.args\.nLayer: expected int, got 2\.7$"),
        ({"nHead": True}, r"task\.args\.nHead: expected int, got True$"),
        ({"blockSize": float("inf")}, r"task\.args\.blockSize: expected int, got inf$"),
        ({"dropout": 1.5}, r"task\.args\.dropout: expected a probability from 0 to 1, got 1\.5"),
        ({"data": "books"}, r"task\.args\.data: expected \"text\" or \"random\", got 'books'"),
        ({"data": "random", "samples": 0}, r"task\.args\.samples: expected an integer >= 1, got 0"),
        ({"data": "random", "samples": "many"}, r"task\.args\.samples: expected int"),
        ({"samples": 10}, r"task\.args\.samples: only with data: \"random\""),
        ({"data": "random", "corpusBytes": 1000}, r"task\.args\.corpusBytes: only with data: \"text\""),
        (
            {"vocab": 1000},
            r"unknown argument\(s\) vocab for builtin gpt \(vocab: did you mean vocabSize\?\); allowed: .*vocabSize",
        ),
    ],
)
def test_a_bad_value_names_the_field_and_what_is_allowed(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_task({**SMALL, **args})


def test_the_smallest_text_corpus_accepted_holds_one_training_window() -> None:
    """blockSize 8: windows of 9 bytes, 4 apart; 13 bytes hold one, 12 none (an empty dataset,
    and fewer than 9 a negative length: an InfraError retried, not a configuration error)."""
    assert len(make_task({**SMALL, "corpusBytes": 13}).dataset) == 1  # type: ignore[arg-type]
    for too_small in (12, 5):
        with pytest.raises(ConfigError, match=rf"task\.args\.corpusBytes: expected at least 13 .*, got {too_small}$"):
            make_task({**SMALL, "corpusBytes": too_small})


@pytest.mark.process
def test_the_trainer_ends_a_bad_vocab_size_as_a_configuration_error_naming_the_field(tmp_path: Path) -> None:
    job = spec(task={"builtin": "gpt", "args": {**SMALL, "vocabSize": 100}})
    run = run_trainer(tmp_path, job, "fp32")
    assert run.code == ExitCode.CONFIG_ERROR, run.stderr
    assert run.report is not None and "task.args.vocabSize: expected an integer >= 256" in run.report.message


def test_step_delay_slows_only_its_precision_and_leaves_the_state_dict_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    delayed, plain = make_task({**SMALL, "stepDelay": {"bf16": 0.2}}), make_task(dict(SMALL))
    assert delayed.model.state_dict().keys() == plain.model.state_dict().keys()
    inputs, _ = delayed.dataset[0]

    def slept(autocast: bool) -> list[float]:
        """The sleeps one forward pass asks for: what it adds, whatever else slows this machine."""
        asked: list[float] = []
        with monkeypatch.context() as patched, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            patched.setattr(time, "sleep", asked.append)
            delayed.model(inputs[None])
        return asked

    assert (slept(True), slept(False)) == ([0.2], [])
    with pytest.raises(ConfigError, match=r"task\.args\.stepDelay"):
        make_task({**SMALL, "stepDelay": {"fp8": 1}})
