"""`mpjob operator`: run the kopf operator (`kopf run -m mpjob.controller.handlers` runs the same
handlers, configured from the environment alone, and its cache of attempt Jobs and pods then
watches every namespace).

SIGTERM and SIGINT stop it, exit 0, at every stage: before kopf runs they end the process at
once (a request to an API server that does not answer included); once kopf runs, kopf's own
handlers take over and stop it gracefully (handlers.configure gives way to them while the
cache waits for its first listing)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Mapping

import kopf

from mpjob import credentials
from mpjob.controller import config
from mpjob.controller.metrics_server import MetricsServer

log = logging.getLogger("mpjob.operator")


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The operator's flags: its configuration's (config.py) and the process's own."""
    parser = argparse.ArgumentParser(
        prog="mpjob operator",
        description=__doc__,
        epilog=f"Environment only: {config.ENV_PROFILE_KEY}, the key the attempts' profile tokens are derived "
        "from (never a flag: a process's arguments are visible to every user of its node).",
    )
    config.add_arguments(parser, environ)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(environ.get("MPJOB_METRICS_PORT", "8080")),
        metavar="PORT",
        help="operator metrics on :PORT/metrics, 0 = off (env MPJOB_METRICS_PORT; default 8080)",
    )
    parser.add_argument(
        "--bind-address",
        default=environ.get("MPJOB_BIND_ADDRESS") or "0.0.0.0",
        metavar="ADDRESS",
        help="address of the metrics and health endpoints (env MPJOB_BIND_ADDRESS; default every interface)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=8081,
        metavar="PORT",
        help="kopf liveness on :PORT/healthz, answering once the cache has listed the attempts' Jobs, pods "
        "and Events; 0 = off (default 8081)",
    )
    parser.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="kopf peering name for several replicas (needs kopf's peering CRDs); default: standalone",
    )
    parser.add_argument(
        "--priority",
        default=environ.get("MPJOB_PEERING_PRIORITY", "oldest"),
        help="kopf peering priority (env MPJOB_PEERING_PRIORITY): an integer (the highest live peer acts, the "
        "others stand by), or "
        "'oldest' (default): the longest-running replica acts, so a rolling upgrade hands over only "
        "when the old operator leaves and extra replicas are hot standbys",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG, kopf's too (default: INFO)")
    return parser


def priority_of(text: str) -> int:
    """The peering priority of --priority: an integer as given, or 'oldest': the earlier this
    replica started, the higher (by start time in ms; a random last three digits break the tie
    between replicas started in the same millisecond, as kopf pauses every peer of equal
    priority). Raises ValueError for anything else."""
    if text == "oldest":
        started_ms = time.time_ns() // 1_000_000
        return -(started_ms * 1000 + secrets.randbelow(1000))
    return int(text)


def liveness_endpoint(bind_address: str, port: int) -> str | None:
    """kopf's liveness URL on the address the metrics listen on (None: --health-port 0). An IPv6
    address (`::`, or a pod's IP on an IPv6 cluster) is bracketed, as a URL needs it."""
    if not port:
        return None
    host = f"[{bind_address}]" if ":" in bind_address and not bind_address.startswith("[") else bind_address
    return f"http://{host}:{port}/healthz"


def configure_logging(*, verbose: bool) -> None:
    """Every log line once, as `time LEVEL logger message` (what the integration tests read): kopf's
    own lines go through the same handler, so kopf.configure, which adds a handler of its own, is
    not called."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )


def stop_on_signals() -> None:
    """Until kopf puts its own handlers in place, SIGTERM and SIGINT end the process, exit 0."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)


def _stop(signum: int, _frame: object) -> None:
    """End the process now. Before kopf's handlers nothing is reconciled or written (kopf handles
    jobs only once its startup, which waits for the cache's first listing, is done), so there is
    nothing to finish. Not SystemExit: raised wherever the main thread is (inside the event loop
    kopf.run has begun, or a log write), it unwound the loop midway (a hang) or finalized the
    interpreter under the cache's running threads (SIGABRT); not `log`: a write this signal
    interrupted would be re-entered. The line is the one thing that may fail (stderr a pipe whose
    reader is gone, or closed): the exit comes all the same, not an OSError raised where the main
    thread stood."""
    try:
        os.write(2, f"{signal.Signals(signum).name} received before the operator started: stopping\n".encode())
    finally:
        os._exit(0)


def cannot_listen(flag: str, port: int, bind_address: str, exc: OSError) -> str:
    """What is said of a port the operator cannot listen on (taken, or an address not this host's)."""
    return f"{flag} {port}: cannot listen on {bind_address} ({exc.strerror or exc})"


def serve_metrics(port: int, bind_address: str) -> tuple[MetricsServer | None, str | None]:
    """The operator's metrics served on `port` (None: 0, not served), or what is wrong when it
    cannot listen there. `main`, which starts it, stops it (`stop_metrics`)."""
    if not port:
        return None, None
    try:
        return MetricsServer.start(port, bind_address), None
    except OSError as exc:
        return None, cannot_listen("--metrics-port", port, bind_address, exc)


def stop_metrics(metrics: MetricsServer | None, timeout: float) -> None:
    """The metrics server stopped and its thread joined (`timeout`), once kopf has returned or
    failed: last, as a scrape reads the parts kopf's cleanup stops; and on every path, as kopf
    runs no cleanup for a startup that failed (before the Controller existed, too)."""
    if metrics is not None and (running := metrics.stop(timeout)):
        log.info("stopped; the metrics thread %s ends with the process", ", ".join(running))


def check_health_port(port: int, bind_address: str) -> str | None:
    """What is wrong with --health-port `port` (None: kopf can listen there, or 0: off). kopf
    listens only once its startup is done, after the cache's first listing, and a taken port
    would then end it with a traceback: so a socket is bound here first, with the SO_REUSEADDR
    that kopf's server (aiohttp) sets too."""
    if not port:
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bind_address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return cannot_listen("--health-port", port, bind_address, exc)
    return None


def main(argv: list[str] | None = None) -> int:
    flags = parser(os.environ)
    args = flags.parse_args(argv)
    configure_logging(verbose=args.verbose)
    stop_on_signals()
    try:
        priority = priority_of(args.priority)
    except ValueError:
        flags.error(f"--priority: an integer or 'oldest', not {args.priority!r}")
    # The peering identity, given to kopf and to the operator's peering check alike: POD_ID (the
    # chart sets it to the pod's name, as kopf itself would read it), else host and process.
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"
    peering = None
    if args.peering is not None:
        peering = config.Peering(
            name=args.peering, identity=identity, priority=priority, clusterwide=not args.namespaces
        )
    settings = config.from_arguments(args, peering=peering)
    try:  # before anything starts: kopf and the cache would retry a missing cluster forever
        credentials.reach()
    except credentials.NoCluster as exc:
        print(f"error: {exc}")
        return 1

    from mpjob.controller import crdcheck, handlers  # handlers: registers them

    crdcheck.at_start()  # a CRD older than this release: a warning (crdcheck's doc)

    refused = check_health_port(args.health_port, args.bind_address)
    metrics, refused = serve_metrics(args.metrics_port, args.bind_address) if refused is None else (None, refused)
    if refused is not None:
        print(f"error: {refused}")
        return 1
    try:
        kopf.run(
            clusterwide=not args.namespaces,
            namespaces=args.namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            identity=identity,
            liveness_endpoint=liveness_endpoint(args.bind_address, args.health_port),
            memo=kopf.Memo(config=settings),
        )
    finally:
        stop_metrics(metrics, handlers.STOP_JOIN_SECONDS)
    return 0
