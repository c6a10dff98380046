"""The API's names and bounds: its group, version and kind, the precisions, phases and limits
that the spec and the status share, and what `auto` means for a precision."""

from __future__ import annotations

from typing import Literal

GROUP = "mpjob.dev"
VERSION = "v1alpha1"
KIND = "MixedPrecisionJob"
PLURAL = "mixedprecisionjobs"
SINGULAR = "mixedprecisionjob"
SHORT_NAMES = ("mpjob", "mpj")
API_VERSION = f"{GROUP}/{VERSION}"

MAX_ATTEMPTS_LIMIT = 99
#: The most optimizer steps a job trains (training.steps), and so the bound of every field that
#: counts steps (warm-up, intervals, the guard's step counts): a larger one could never be reached.
MAX_STEPS = 100_000_000
#: A year: the longest deadline or wait a job's runPolicy may state, in seconds.
MAX_POLICY_SECONDS = 365 * 24 * 3600
#: The largest loss scale (precision.lossScale.init, guard.minLossScale): 2^32 times any loss
#: overflows fp16's 65504 on the first step, and the scale backs off from there.
MAX_LOSS_SCALE = float(2**32)
#: status.attempts keeps the first attempt and the newest ones, this many in all; the rest are
#: counted in status.attemptCounts (uncharged attempts have no limit but the deadline).
MAX_ATTEMPT_ENTRIES = 21
MAX_WORKERS = 256
MAX_PROCESSES_PER_WORKER = 64
#: task.args entries at most (the CRD's maxProperties): they travel in every trainer pod's env.
MAX_TASK_ARGS = 64
#: How deep a task.args value nests: a scalar, or lists and maps at most this many levels deep
#: ({lr: 0.1}, {betas: [0.9, 0.95]}, {layers: [{dim: 64}]}, {opt: {adam: {betas: [0.9]}}}). The
#: CRD says the same (mpjob.crd), so the API server refuses a deeper document before it is
#: stored: a free-form field takes thousands of levels, more than a client's JSON parser reads.
MAX_TASK_ARG_DEPTH = 3

Precision = Literal["fp8", "fp16", "bf16", "fp32"]
#: The precisions from the least safe to the safest: a fallback only ever goes right, a
#: re-promotion left (fp8 < fp16 < bf16 < fp32).
SAFETY: tuple[Precision, ...] = ("fp8", "fp16", "bf16", "fp32")
#: The one precision an attempt trains with a GradScaler (a loss scale, whose overflows and
#: collapse the guard watches): bf16 and fp32 have fp32's exponent range, and fp8's float8
#: linears (torchao) scale their own tensors, the rest of the model under bf16 autocast.
LOSS_SCALED: Precision = "fp16"
#: A precision, or `auto` until the trainer measured its node: the spec's mode, and an attempt's
#: precision until its measurement relabels it (`settled`). On the wire, the same strings.
RequestedPrecision = Literal["auto", "fp8", "fp16", "bf16", "fp32"]
PrecisionMode = RequestedPrecision
BuiltinTask = Literal["gpt", "mlp"]
#: training.compile: `auto` compiles on CUDA devices only (where it pays for its compile time).
CompileMode = Literal["auto", "always", "never"]
Phase = Literal["Pending", "Running", "Recovering", "Succeeded", "Failed", "Suspended"]


def is_auto(precision: str | None) -> bool:
    """Whether `precision` is still `auto`: its trainer has not measured the node yet."""
    return precision == "auto"


def settled(precision: RequestedPrecision, measured: Precision | None) -> RequestedPrecision:
    """An `auto` precision, once measured, is the measured one; any other stays as it is."""
    return measured if is_auto(precision) and measured else precision


def safer_than(precision: str, than: str) -> bool:
    """Whether `precision` is a safer rung than `than` (`auto`, or no precision: any is)."""
    if than not in SAFETY:
        return True
    return precision in SAFETY and SAFETY.index(precision) > SAFETY.index(than)


def resolve_auto(mode: PrecisionMode, compute_capability: tuple[int, int] | None) -> Precision:
    """Resolve `auto` for a device: None means CPU. Explicit modes pass through."""
    if mode != "auto":
        return mode
    if compute_capability is None:
        return "bf16"
    if compute_capability >= (8, 0):
        return "bf16"
    if compute_capability >= (7, 0):
        return "fp16"
    return "fp32"
