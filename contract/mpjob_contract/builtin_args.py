"""The built-in workloads' task.args (`gpt`, `mlp`): their names, types and bounds, read once.

The trainer builds its workloads from what these functions return (mpjob_trainer.tasks), and
the spec model (`spec.Task`) runs `check` on a builtin task's args, so `mpjob validate`, `mpjob
run` and the operator refuse what the trainer would refuse at start, with the same words, and
take everything it takes. No torch here: the operator imports this module too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpjob_contract.spelling import did_you_mean

#: The text data's ids are bytes: the smallest vocabulary a gpt task may have.
BYTE_VOCAB = 256
#: What task.args.data of a gpt task may be.
GPT_DATA_KINDS = ("text", "random")
#: Precisions task.args.stepDelay may slow down, and its largest delay (seconds per forward pass).
DELAYED_PRECISIONS = ("fp32", "bf16", "fp16")
MAX_STEP_DELAY = 60
_FAULTS = {"overflowAtStep", "overflowGain", "overflowUntilStep", "stepDelay"}
KNOWN: dict[str, frozenset[str]] = {
    "gpt": frozenset(
        {"nLayer", "nHead", "nEmbd", "blockSize", "vocabSize", "dropout", "data", "corpusBytes", "samples"} | _FAULTS
    ),
    "mlp": frozenset(
        {"inputs", "hidden", "layers", "samples", "evalSamples", "nonFiniteSamples", "batchScale"}
        | {"outOfMemoryAbove", "outOfMemoryFromStep", "cancellationOffset", "fp8OutlierAtStep", "fp8OutlierUntilStep"}
        | _FAULTS
    ),
}


class BadTaskArg(ValueError):
    """A builtin task's argument the workload cannot take: `field` (below task.args) and why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"task.args.{field}: {why}" if field else f"task.args: {why}")
        self.field, self.why = field, why


def _number(value: Any) -> bool:
    """Whether `value` is a number: a boolean is not, though Python counts True as 1 (YAML reads an
    unquoted yes or on as true, a typo a job would otherwise train with as 1)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    """Whether `value` is an int, not a boolean (a sample index or a step, taken only as written)."""
    return isinstance(value, int) and not isinstance(value, bool)


def arg(args: dict[str, Any], name: str, default: Any, kind: type) -> Any:
    """One argument converted to `kind` (None: not set and no default), naming it when it cannot be.

    A boolean, or a fraction where an int is read, is refused, not converted: int() would train 2
    layers for 2.7 and 1 for true, and never tell. A whole number written 16.0 (or quoted, "64") is
    taken, as the API server takes a whole JSON number for an integer field (`k8s.is_integer`) and
    as these args have always been read."""
    value = args.get(name, default)
    if value is None:
        return None
    bad = BadTaskArg(name, f"expected {kind.__name__}, got {value!r}")
    if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise bad  # true; 2.7, inf or nan (int() truncates, or raises OverflowError on inf)
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise bad from exc


def check_known(args: dict[str, Any], builtin: str) -> None:
    """Refuse an argument the workload does not know, naming those it does."""
    known = KNOWN[builtin]
    if unknown := sorted(set(args) - known):
        close = [f"{name}: {hint}" for name in unknown if (hint := did_you_mean(name, sorted(known)))]
        meant = f" ({'; '.join(close)})" if close else ""
        raise BadTaskArg(
            "",
            f"unknown argument(s) {', '.join(unknown)} for builtin {builtin}{meant}; "
            f"allowed: {', '.join(sorted(known))}",
        )


def poisoned_indices(value: Any, size: int) -> set[int] | None:
    """task.args.nonFiniteSamples as a set of sample indices (None: no poisoning)."""
    if value is None:
        return None
    if value == "all":
        return set(range(size))
    if not isinstance(value, list) or not all(_whole(i) and 0 <= i < size for i in value):
        raise BadTaskArg("nonFiniteSamples", f'expected "all" or a list of sample indices in [0, {size})')
    return set(value)


@dataclass(frozen=True)
class BatchScaleArgs:
    """task.args.batchScale: targets x factor at optimizer steps [at, at + steps)."""

    at: int | None = None
    steps: int = 0
    factor: float = 1.0


def batch_scale(value: Any) -> BatchScaleArgs:
    """task.args.batchScale (none: targets as they are)."""
    if value is None:
        return BatchScaleArgs()
    bad = BadTaskArg("batchScale", "expected {atStep: step, steps: n >= 1 (default 3), factor: f > 0 (default 1000)}")
    if not isinstance(value, dict) or set(value) - {"atStep", "steps", "factor"}:
        raise bad
    at, steps, factor = value.get("atStep"), value.get("steps", 3), value.get("factor", 1000.0)
    if not _whole(at) or not _whole(steps) or steps < 1:
        raise bad
    if not _number(factor) or factor <= 0:
        raise bad
    return BatchScaleArgs(at, steps, float(factor))


def step_delays(value: Any) -> dict[str, float]:
    """task.args.stepDelay as {precision: seconds}."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        k in DELAYED_PRECISIONS and _number(v) and 0 <= v <= MAX_STEP_DELAY for k, v in value.items()
    ):
        allowed = "|".join(DELAYED_PRECISIONS)
        raise BadTaskArg("stepDelay", f"expected {{{allowed}: seconds between 0 and {MAX_STEP_DELAY}}}, got {value!r}")
    return {k: float(v) for k, v in value.items()}


@dataclass(frozen=True)
class GptShape:
    """The gpt model's shape (task.args nLayer, nHead, nEmbd, blockSize, vocabSize, dropout)."""

    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    vocab_size: int = BYTE_VOCAB
    dropout: float = 0.0


def gpt_shape(args: dict[str, Any]) -> GptShape:
    """The gpt model's shape from task.args; a bad value names its field and what is allowed."""
    d = GptShape()  # the defaults: one place
    c = GptShape(
        n_layer=arg(args, "nLayer", d.n_layer, int),
        n_head=arg(args, "nHead", d.n_head, int),
        n_embd=arg(args, "nEmbd", d.n_embd, int),
        block_size=arg(args, "blockSize", d.block_size, int),
        vocab_size=arg(args, "vocabSize", d.vocab_size, int),
        dropout=arg(args, "dropout", d.dropout, float),
    )
    if c.n_layer < 1 or c.n_head < 1 or c.n_embd < 1 or c.block_size < 2:
        raise BadTaskArg("", "nLayer, nHead, nEmbd must be >= 1 and blockSize >= 2")
    if c.n_embd % c.n_head:
        raise BadTaskArg("nEmbd", f"({c.n_embd}) must be a multiple of nHead ({c.n_head})")
    if c.vocab_size < BYTE_VOCAB:
        raise BadTaskArg(
            "vocabSize", f"expected an integer >= {BYTE_VOCAB} (the text data's byte ids), got {c.vocab_size}"
        )
    if not 0 <= c.dropout <= 1:  # torch's bound: past it, building the model raises in the pod
        raise BadTaskArg("dropout", f"expected a probability from 0 to 1, got {c.dropout:g}")
    return c


@dataclass(frozen=True)
class GptData:
    """The gpt task's training data: `text` (corpus_bytes of it) or `random` (samples windows)."""

    kind: str
    corpus_bytes: int = 200_000
    samples: int = 1024


def text_stride(block_size: int) -> int:
    """Bytes between the starts of two training windows of the text corpus: half a block."""
    return max(1, block_size // 2)


def text_windows(corpus_bytes: int, block_size: int) -> int:
    """Training windows (blockSize + 1 bytes each, text_stride apart) a corpus of corpus_bytes holds."""
    return max(0, (corpus_bytes - block_size - 1) // text_stride(block_size))


def gpt_data(args: dict[str, Any], block_size: int) -> GptData:
    """task.args.data and its size (corpusBytes for text, samples for random), each only with its
    kind; a text corpus holds at least one window of block_size + 1 bytes (none would be an empty
    dataset at start, too few bytes a negative length)."""
    kind = args.get("data", "text")
    if kind not in GPT_DATA_KINDS:
        raise BadTaskArg("data", f'expected "text" or "random", got {kind!r}')
    if kind == "text":
        if "samples" in args:
            raise BadTaskArg("samples", 'only with data: "random" (text windows come from corpusBytes)')
        size = arg(args, "corpusBytes", GptData.corpus_bytes, int)
        if text_windows(size, block_size) < 1:
            least = block_size + 1 + text_stride(block_size)
            default = "" if "corpusBytes" in args else " (the default)"
            raise BadTaskArg(
                "corpusBytes",
                f"expected at least {least} bytes, a training window for blockSize {block_size}, got {size}{default}",
            )
        return GptData(kind, corpus_bytes=size)
    if "corpusBytes" in args:
        raise BadTaskArg("corpusBytes", 'only with data: "text" (random data is sized by samples)')
    count = arg(args, "samples", GptData.samples, int)
    if count < 1:
        raise BadTaskArg("samples", f"expected an integer >= 1, got {count}")
    return GptData(kind, samples=count)


@dataclass(frozen=True)
class MlpShape:
    """The mlp task's sizes (task.args inputs, hidden, layers, samples, evalSamples)."""

    inputs: int
    hidden: int
    layers: int
    samples: int
    eval_samples: int


def mlp_shape(args: dict[str, Any]) -> MlpShape:
    """The mlp task's sizes from task.args, each at least 1."""
    shape = MlpShape(
        inputs=arg(args, "inputs", 32, int),
        hidden=arg(args, "hidden", 64, int),
        layers=arg(args, "layers", 2, int),
        samples=arg(args, "samples", 4096, int),
        eval_samples=arg(args, "evalSamples", 256, int),
    )
    if min(shape.inputs, shape.hidden, shape.layers, shape.samples, shape.eval_samples) < 1:
        raise BadTaskArg("", "inputs, hidden, layers, samples and evalSamples must be >= 1")
    return shape


def outlier_reaches_a_linear(args: dict[str, Any], layers: int) -> None:
    """task.args.fp8OutlierAtStep scales the input of the mlp's first inner linear: an mlp of one
    layer has none (its two linears are the first and the last, which fp8 never converts either),
    so the outlier asked for would never come and the job would train as if it had not asked."""
    if args.get("fp8OutlierAtStep") is not None and layers < 2:
        raise BadTaskArg("fp8OutlierAtStep", f"needs an inner linear to reach: layers >= 2, got layers {layers}")


#: Plain numeric arguments of each workload and their types (read where the workload builds its faults).
_NUMBERS = {
    "overflowAtStep": int,
    "overflowGain": float,
    "overflowUntilStep": int,
    "outOfMemoryAbove": int,
    "outOfMemoryFromStep": int,
    "cancellationOffset": float,
    "fp8OutlierAtStep": int,
    "fp8OutlierUntilStep": int,
}


def check(builtin: str, args: dict[str, Any]) -> None:
    """Everything the builtin workload reads from its task.args, read as it reads them (BadTaskArg)."""
    check_known(args, builtin)
    for name in set(_NUMBERS) & set(args):
        arg(args, name, None, _NUMBERS[name])
    step_delays(args.get("stepDelay"))
    if builtin == "gpt":
        gpt_data(args, gpt_shape(args).block_size)
        return
    shape = mlp_shape(args)
    poisoned_indices(args.get("nonFiniteSamples"), shape.samples)
    batch_scale(args.get("batchScale"))
    outlier_reaches_a_linear(args, shape.layers)
