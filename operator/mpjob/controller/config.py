"""The operator's configuration, built once when it starts and handed to the handlers in kopf's
memo: nothing reads the environment at import and no module keeps settings of its own.

Each setting is a flag of `mpjob operator` whose default comes from an MPJOB_* environment
variable: the Helm chart and the benchmarks set the variables, people type the flags.
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from mpjob.builders.attempt import TRAINER_COMMAND
from mpjob.builders.network_policy import MetricsReaders
from mpjob.planning.backoff import BASE_SECONDS, ENV_BASE, backoff_base
from mpjob_contract.formats import whole_number

ENV_TRAINER_IMAGE = "MPJOB_TRAINER_IMAGE"
ENV_TRAINER_COMMAND = "MPJOB_TRAINER_COMMAND"
ENV_TICK_SECONDS = "MPJOB_TICK_SECONDS"
ENV_MAX_TICKS_PER_SECOND = "MPJOB_MAX_TICKS_PER_SECOND"
ENV_WORKERS = "MPJOB_WORKERS"
ENV_NETWORK_POLICY = "MPJOB_NETWORK_POLICY"
#: The key attempts' profile tokens are derived from (builders.profile_token): environment
#: only, never a flag (a process's arguments are visible to every user of its node).
ENV_PROFILE_KEY = "MPJOB_PROFILE_KEY"
ENV_ATTEMPT_BACKOFF_SECONDS = ENV_BASE  # mpjob.planning.backoff: `mpjob run` reads it too

DEFAULT_TRAINER_IMAGE = "mpjob-trainer:0.1.0"


@dataclass(frozen=True, slots=True)
class Peering:
    """kopf peering as the operator's own peering check reads it: the peering object's name,
    this replica's identity and priority, and whether the object is cluster-wide."""

    name: str
    identity: str
    priority: int
    clusterwide: bool


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    #: The trainer image of a job whose spec names none.
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    #: The trainer's command under the launcher. Only benchmarks and tests change it (a stand-in).
    trainer_command: tuple[str, ...] = TRAINER_COMMAND
    #: Each unfinished job is reconciled, and its live progress read, once per this interval.
    tick_seconds: float = 5.0
    #: The ticker's ceiling: with many jobs a round takes longer than tick_seconds rather than
    #: crowding out the event-driven reconciles (attempt starts and ends never wait for it).
    max_ticks_per_second: float = 20.0
    #: Threads of the work queue (reconciles of different jobs run side by side).
    workers: int = 16
    #: The namespaces the operator serves; empty: every namespace.
    namespaces: tuple[str, ...] = ()
    #: How long a reconcile that failed (a transient API error) waits before it is tried again;
    #: doubled for each failure of the same job in a row, up to retry_max_seconds.
    retry_seconds: float = 1.0
    retry_max_seconds: float = 120.0
    #: The wait before an attempt that retries a failure as it was: this, doubled per failure in
    #: a row, at most backoff.CAP_SECONDS (mpjob.planning.backoff).
    attempt_backoff_seconds: float = BASE_SECONDS
    #: kopf peering; None: a standalone operator, always active.
    peering: Peering | None = None
    #: How long a read of the peering object is trusted (the queue asks before each reconcile).
    peering_check_seconds: float = 1.0
    #: The longest read of a trainer's metrics endpoint (one deadline for the whole response).
    scrape_timeout_seconds: float = 2.0
    #: The most bytes read of one metrics response (the trainer's is a few kilobytes).
    scrape_max_bytes: int = 1024 * 1024
    #: Metrics endpoints read at once (off the reconcile workers).
    progress_readers: int = 4
    #: Each attempt gets a NetworkPolicy admitting only its own pods and, to the metrics port,
    #: these readers; None: no policy (the chart turns it on).
    network_policy: MetricsReaders | None = None
    #: The key of the attempts' profile tokens; none configured: a random one per process.
    profile_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False, compare=False)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number, not {text!r}")
    return value


def _count(text: str) -> int:
    count = whole_number(text)
    if count is None or count < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return count


def _backoff(text: str) -> float:
    try:
        return backoff_base(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _command(text: str) -> tuple[str, ...]:
    try:
        argv = json.loads(text)
    except json.JSONDecodeError:
        argv = None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise argparse.ArgumentTypeError(f'a JSON list of strings such as ["mpjob-trainer"], not {text!r}')
    return tuple(argv)


class _Requirement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class _Selector(BaseModel):
    """A Kubernetes LabelSelector."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid")

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[_Requirement] = Field(default_factory=list)


class _Readers(BaseModel):
    """--network-policy's JSON (the chart writes it): MetricsReaders in camelCase."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid")

    operator_namespace: str = Field(min_length=1)
    operator_labels: dict[str, str] = Field(min_length=1)
    monitoring_namespaces: _Selector | None = None
    monitoring_pods: _Selector = Field(default_factory=_Selector)

    @field_validator("monitoring_namespaces")
    @classmethod
    def _not_every_namespace(cls, selector: _Selector | None) -> _Selector | None:
        if selector is not None and not (selector.match_labels or selector.match_expressions):
            raise ValueError("selects every namespace; name them, or say so with an Exists expression")
        return selector


def _network_policy(text: str) -> MetricsReaders | None:
    """MetricsReaders from JSON; empty: no NetworkPolicy."""
    if not text.strip():
        return None
    try:
        readers = _Readers.model_validate_json(text)
    except ValidationError as exc:
        error = exc.errors()[0]
        where, said = ".".join(str(p) for p in error["loc"]), error["msg"].removeprefix("Value error, ")
        raise argparse.ArgumentTypeError(f"{where}: {said}" if where else said) from exc
    namespaces = readers.monitoring_namespaces
    return MetricsReaders(
        operator_namespace=readers.operator_namespace,
        operator_labels=readers.operator_labels,
        monitoring_namespaces=namespaces.model_dump(by_alias=True, exclude_defaults=True) if namespaces else None,
        monitoring_pods=readers.monitoring_pods.model_dump(by_alias=True, exclude_defaults=True),
    )


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """The configuration's flags, each defaulting to its environment variable."""
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        metavar="NAMESPACE",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--trainer-image",
        metavar="IMAGE",
        default=environ.get(ENV_TRAINER_IMAGE) or DEFAULT_TRAINER_IMAGE,
        help=f"default trainer image (env {ENV_TRAINER_IMAGE}; default {DEFAULT_TRAINER_IMAGE})",
    )
    parser.add_argument(
        "--trainer-command",
        type=_command,
        metavar="JSON",
        default=environ.get(ENV_TRAINER_COMMAND) or json.dumps(list(TRAINER_COMMAND)),
        help=f"the trainer's command under the launcher, a JSON list (env {ENV_TRAINER_COMMAND}); "
        "for stand-in trainers in benchmarks and tests",
    )
    parser.add_argument(
        "--tick-seconds",
        type=_positive,
        metavar="SECONDS",
        default=environ.get(ENV_TICK_SECONDS) or "5",
        help=f"reconcile/progress interval per job (env {ENV_TICK_SECONDS}; default 5)",
    )
    parser.add_argument(
        "--max-ticks-per-second",
        type=_positive,
        metavar="N",
        default=environ.get(ENV_MAX_TICKS_PER_SECOND) or "20",
        help=f"ceiling on the ticker's reconciles per second (env {ENV_MAX_TICKS_PER_SECOND}; default 20); "
        "with more jobs than tick-seconds x this, a round of ticks takes longer",
    )
    parser.add_argument(
        "--workers",
        type=_count,
        metavar="N",
        default=environ.get(ENV_WORKERS) or "16",
        help=f"reconciles that may run at once, each for a different job (env {ENV_WORKERS}; default 16)",
    )
    parser.add_argument(
        "--network-policy",
        type=_network_policy,
        metavar="JSON",
        default=environ.get(ENV_NETWORK_POLICY, ""),
        help=f"give each attempt a NetworkPolicy (env {ENV_NETWORK_POLICY}): JSON with operatorNamespace, "
        "operatorLabels, and optionally monitoringNamespaces and monitoringPods (label selectors) of who may "
        "read the trainers' metrics; default: none",
    )
    _add_backoff(parser, environ)
    parser.set_defaults(profile_key=environ.get(ENV_PROFILE_KEY, ""))


def _add_backoff(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    parser.add_argument(
        "--attempt-backoff-seconds",
        type=_backoff,
        metavar="SECONDS",
        default=environ.get(ENV_ATTEMPT_BACKOFF_SECONDS) or f"{BASE_SECONDS:g}",
        help=f"the first wait before an attempt that retries a failure, doubled per failure in a row "
        f"(env {ENV_ATTEMPT_BACKOFF_SECONDS}; default {BASE_SECONDS:g}; 0: none)",
    )


def from_arguments(args: argparse.Namespace, *, peering: Peering | None = None) -> OperatorConfig:
    """The configuration of parsed flags (see `add_arguments`)."""
    key = str(getattr(args, "profile_key", "") or "").encode()
    return OperatorConfig(
        trainer_image=args.trainer_image,
        trainer_command=args.trainer_command,
        tick_seconds=args.tick_seconds,
        max_ticks_per_second=args.max_ticks_per_second,
        workers=args.workers,
        namespaces=tuple(args.namespaces),
        peering=peering,
        network_policy=args.network_policy,
        attempt_backoff_seconds=args.attempt_backoff_seconds,
        profile_key=key or secrets.token_bytes(32),
    )


def from_environment(environ: Mapping[str, str]) -> OperatorConfig:
    """The configuration with no flags given (`kopf run -m mpjob.controller.handlers`)."""
    parser = argparse.ArgumentParser(prog="mpjob operator")
    add_arguments(parser, environ)
    return from_arguments(parser.parse_args([]))
