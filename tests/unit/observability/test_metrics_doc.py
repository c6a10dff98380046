"""docs/metrics.md lists exactly the metrics the trainer and the operator define (names as
exported, types, labels), in both directions."""

from __future__ import annotations

import re

import pytest
from prometheus_client.metrics import MetricWrapperBase

from mpjob_contract import metrics as names
from tests.unit.observability.promtool import METRICS_DOC, documented

pytestmark = pytest.mark.unit


def exported(name: str, kind: str) -> str:
    return name + "_total" if kind == "counter" else name


def trainer_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    from mpjob_trainer.metrics import TrainerMetrics

    registry = TrainerMetrics("j", "ns", 0, "fp16").registry
    out = {}
    for collector in list(registry._collector_to_names):  # the wrappers, with their label names
        assert isinstance(collector, MetricWrapperBase)
        out[exported(collector._name, collector._type)] = (collector._type, tuple(collector._labelnames))
    return out


def operator_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    import mpjob.controller.metrics as om

    return {
        exported(m._name, m._type): (m._type, tuple(m._labelnames))
        for m in vars(om).values()
        if isinstance(m, MetricWrapperBase)
    }


def test_every_trainer_metric_is_documented_and_nothing_else() -> None:
    assert documented("Trainer") == trainer_metrics()


def test_every_operator_metric_is_documented_and_nothing_else() -> None:
    assert documented("Operator") == operator_metrics()


def test_the_trainer_serves_every_name_of_the_contract() -> None:
    """The contract module is the single source: each name there is served, and vice versa."""
    contract = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith(names.PREFIX)}
    contract.discard(names.PREFIX)
    assert {n.removesuffix("_total") for n in trainer_metrics()} == contract


def test_trainer_metrics_carry_the_contract_labels() -> None:
    for name, (_, labels) in trainer_metrics().items():
        assert labels[: len(names.LABELS)] == names.LABELS, name


def test_every_documented_metric_names_what_it_serves() -> None:
    text = METRICS_DOC.read_text()
    for name in {**documented("Trainer"), **documented("Operator")}:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        serves = row.rstrip(" |").rsplit("|", 1)[1]
        assert re.search(r"\bM\d+\b|\bF\d\b|operator health", serves), name


def test_doc_parser_sees_a_missing_metric() -> None:
    """The comparison is not vacuous: both sides are non-empty and the counters carry _total."""
    trainer = documented("Trainer")
    assert len(trainer) == len(trainer_metrics()) >= 20
    assert "mpjob_trainer_overflow_steps_total" in trainer
    assert "mpjob_operator_precision_fallbacks_total" in documented("Operator")


def test_the_change_series_row_names_every_kind_of_change_the_trainer_serves() -> None:
    """A split made in place after running out of memory is a series too (kind microBatch)."""
    from typing import get_args

    from mpjob_contract.report import ChangeKind

    row = next(
        line for line in METRICS_DOC.read_text().splitlines() if line.startswith(f"| `{names.PRECISION_CHANGE}` |")
    )
    assert {kind for kind in get_args(ChangeKind) if f"`{kind}`" not in row} == set()
