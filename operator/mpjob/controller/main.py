"""`mpjob operator`: run the kopf operator (`kopf run -m mpjob.controller.handlers` runs the same
handlers, but its cache of attempt Jobs and pods then watches every namespace)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import time

import kopf
from prometheus_client import start_http_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpjob operator", description=__doc__)
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("MPJOB_METRICS_PORT", "8080")),
        help="operator metrics on :PORT/metrics (0 = off)",
    )
    parser.add_argument(
        "--bind-address",
        default=os.environ.get("MPJOB_BIND_ADDRESS") or "0.0.0.0",
        help="address of the metrics and health endpoints (env MPJOB_BIND_ADDRESS; default every interface)",
    )
    parser.add_argument("--health-port", type=int, default=8081, help="kopf liveness on :PORT/healthz (0 = off)")
    parser.add_argument("--trainer-image", default=None, help="default trainer image (env MPJOB_TRAINER_IMAGE)")
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering name for several replicas (needs kopf's peering CRDs); default: standalone",
    )
    parser.add_argument(
        "--priority",
        default=os.environ.get("MPJOB_PEERING_PRIORITY", "oldest"),
        help="kopf peering priority: an integer (the highest live peer acts, the others stand by), or "
        "'oldest' (default): the longest-running replica acts, so a rolling upgrade hands over only "
        "when the old operator leaves and extra replicas are hot standbys",
    )
    parser.add_argument(
        "--max-ticks-per-second",
        type=float,
        default=None,
        help="ceiling on the ticker's reconciles per second (default 20); with more jobs than "
        "tick-seconds x this, a round of ticks takes longer",
    )
    parser.add_argument("--tick-seconds", type=float, default=None, help="reconcile/progress interval per job")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.trainer_image:
        os.environ["MPJOB_TRAINER_IMAGE"] = args.trainer_image
    if args.tick_seconds:
        os.environ["MPJOB_TICK_SECONDS"] = str(args.tick_seconds)
    if args.max_ticks_per_second:
        os.environ["MPJOB_MAX_TICKS_PER_SECOND"] = str(args.max_ticks_per_second)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        # Oldest first by start time in ms; a random last three digits break the tie between
        # replicas started in the same millisecond (kopf pauses every peer of equal priority).
        started_ms = time.time_ns() // 1_000_000
        priority = -(started_ms * 1000 + secrets.randbelow(1000)) if args.priority == "oldest" else int(args.priority)
    except ValueError:
        parser.error(f"--priority: an integer or 'oldest', not {args.priority!r}")
    # The peering identity, given to kopf and to the ticker's peering check alike: POD_ID (the
    # chart sets it to the pod's name, as kopf itself would read it), else host and process.
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"

    from mpjob.controller import handlers  # registers the handlers

    handlers.NAMESPACES[:] = args.namespace
    if args.peering is not None:
        handlers.PEERING.update(name=args.peering, identity=identity, priority=priority, clusterwide=not args.namespace)

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority,
        identity=identity,
        liveness_endpoint=f"http://{args.bind_address}:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0
