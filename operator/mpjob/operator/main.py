"""`mpjob operator`: run the kopf operator (also `kopf run -m mpjob.operator.handlers`)."""

from __future__ import annotations

import argparse
import logging
import os

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
    parser.add_argument("--health-port", type=int, default=8081, help="kopf liveness on :PORT/healthz (0 = off)")
    parser.add_argument("--trainer-image", default=None, help="default trainer image (env MPJOB_TRAINER_IMAGE)")
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering name for several replicas (needs kopf's peering CRDs); default: standalone",
    )
    parser.add_argument("--tick-seconds", type=float, default=None, help="reconcile/progress interval per job")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.trainer_image:
        os.environ["MPJOB_TRAINER_IMAGE"] = args.trainer_image
    if args.tick_seconds:
        os.environ["MPJOB_TICK_SECONDS"] = str(args.tick_seconds)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    import mpjob.operator.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        start_http_server(args.metrics_port)
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0
