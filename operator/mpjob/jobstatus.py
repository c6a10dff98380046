"""`mpjob status NAME [-n NAMESPACE] [--kubeconfig FILE] [--plot FILE]`: a job on a cluster,
summed up as `mpjob run` sums up a local one (attempts, recoveries, skips, the last checkpoint,
cost), and drawn the same way (precision spans, the loss-scale history of status.timeline, each
attempt's last loss) so a cluster's user can look instead of reading YAML. `mpjob status DIR`
prints again what `mpjob run --out DIR` printed at its end, from the report.json it left, and
draws it with --plot from the series.json it left (a run with --no-plot drew no training.png)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mpjob.localrun.folder import REPORT, NotARun, folder_lines, folder_series, is_folder_argument, read_folder
from mpjob.localrun.paths import default_out
from mpjob.localrun.series import RunSeries
from mpjob.summary import summary_lines
from mpjob_contract import api, formats

#: Connect and read timeouts of the one API request (seconds): an unreachable cluster is said quickly.
REQUEST_TIMEOUT = (5, 20)


class CannotRead(Exception):
    """The job could not be read: the message says why, for the user."""


def status_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mpjob status", description=__doc__)
    parser.add_argument(
        "name",
        type=_job_or_folder,
        metavar="NAME|DIR",
        help="the MixedPrecisionJob's name, or a local run's folder (`mpjob run --out DIR`) or its report.json",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        type=_named(formats.NAMESPACE),
        help="its namespace (default: the kubeconfig context's, else default)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--plot", type=Path, metavar="FILE", help="also draw the job into this PNG")
    args = parser.parse_args(argv)
    cluster = bool(args.namespace or args.kubeconfig)
    if is_folder_argument(args.name, cluster=cluster):
        if cluster:
            parser.error(f"{args.name} is a path: -n and --kubeconfig are for a job on a cluster")
        return _local(Path(args.name), args.plot)
    try:
        namespace, obj = read_job(args.name, args.namespace, args.kubeconfig)
        status = api.MixedPrecisionJobStatus.model_validate(obj.get("status") or {})
    except CannotRead as exc:
        print(f"error: {exc}{_local_run_of(args.name, cluster=cluster)}")
        return 1
    except ValidationError as exc:
        print(f"error: the status of {args.name} is not one this mpjob reads ({exc.error_count()} problem(s))")
        return 1
    print("\n".join(_job_lines(f"{namespace}/{args.name}", namespace, obj, status)))
    if args.plot is not None:
        return _plot(args.plot, f"{namespace}/{args.name}", status)
    return 0


def _job_lines(title: str, namespace: str, obj: dict[str, Any], status: api.MixedPrecisionJobStatus) -> list[str]:
    """The job's summary; for one with no status, that no operator took it up: the operator writes
    one at its first reconcile (an attempt, or Suspended), so "Pending" would have the user wait
    for what no operator is doing (none runs, or none watches the job's namespace)."""
    if not obj.get("status"):
        return [
            f"{title}: no status yet: no mpjob operator has taken it up (one does within seconds of its creation); "
            f"is one running and watching namespace {namespace}?"
        ]
    return summary_lines(title, status, now=datetime.now(UTC))


def _local_run_of(name: str, *, cluster: bool) -> str:
    """'; the local run of that name: mpjob status runs/NAME' when `mpjob run` left one here under
    its default --out and the command named no cluster; else ''."""
    folder = default_out(name)
    if cluster or not (folder / REPORT).is_file():
        return ""
    return f"; the local run of that name: mpjob status {folder}"


def _job_or_folder(text: str) -> str:
    """A job's name, or a path to what is there (a local run's folder or report: `_local`)."""
    if re.fullmatch(formats.JOB_NAME.pattern, text) or (text and Path(text).exists()):
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: neither a local run's folder or report.json (no such file or folder) nor a job's name "
        f"(must be {formats.JOB_NAME.allows})"
    )


def _local(target: Path, plot: Path | None) -> int:
    """The local run's summary, as `mpjob run` printed it at its end (`localrun.folder`), and with
    `plot` the run drawn again from the series it recorded, as its end drew training.png."""
    try:
        run = read_folder(target)
        print("\n".join(folder_lines(run)))
    except NotARun as exc:
        print(f"error: {exc}")
        return 1
    if plot is None:
        return 0
    try:
        series = folder_series(run)
    except NotARun as exc:
        print(f"error: --plot {plot}: {exc}")
        return 1
    return _plot(plot, run.name, run.status, series)


def _named(rule: formats.Format) -> Callable[[str], str]:
    """An argument checked against a name's format before it goes into a request's URL (an empty
    name read the whole collection, a `/` reached another path)."""

    def checked(text: str) -> str:
        if not re.fullmatch(rule.pattern, text):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule.allows}")
        return text

    return checked


def read_job(name: str, namespace: str | None, kubeconfig: str | None) -> tuple[str, dict[str, Any]]:
    """(namespace, the MixedPrecisionJob as the API server returns it); CannotRead says why not."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from mpjob import credentials

    try:
        with credentials.reading_kubeconfig():
            _, context = config.list_kube_config_contexts(config_file=kubeconfig)
            api_client = config.new_client_from_config(config_file=kubeconfig)
    except credentials.NoCluster as exc:
        raise CannotRead(str(exc)) from exc
    api_client.configuration.retries = 0
    namespace = namespace or (context or {}).get("context", {}).get("namespace") or "default"
    custom = client.CustomObjectsApi(api_client)
    try:
        obj = custom.get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CannotRead(f"MixedPrecisionJob {namespace}/{name} not found") from exc
        raise CannotRead(f"the API server refused to read {namespace}/{name}: {exc.status} {exc.reason}") from exc
    except Exception as exc:  # urllib3's connection, TLS and timeout errors
        raise CannotRead(str(credentials.unreachable(api_client.configuration.host, exc))) from exc
    if not isinstance(obj, dict):
        raise CannotRead(f"the API server answered {namespace}/{name} with something other than an object")
    return namespace, obj


def _plot(path: Path, title: str, status: api.MixedPrecisionJobStatus, series: RunSeries | None = None) -> int:
    """The job drawn into `path`: from `series` (a local run's record), else from its status alone."""
    try:
        from mpjob.localrun.plot import render
        from mpjob.localrun.series import series_of_status
    except ModuleNotFoundError as exc:  # matplotlib is in the local extra
        print(f"error: --plot needs the local extra ({exc.name} is missing): pip install 'mpjob[local]'")
        return 2
    try:
        with path.open("wb") as file:
            render(
                series_of_status(status) if series is None else series,
                file,
                f"{title}: {status.phase}",
                timeline=status.timeline,
            )
    except OSError as exc:
        print(f"error: --plot {path}: cannot write it ({exc.strerror or exc})")
        return 2
    print(f"  plot: {path}")
    return 0
