"""The operator's metrics endpoint stops with the operator: kopf's cleanup shuts prometheus_client's
HTTP server down and joins its thread, as it joins the cache's watches and the queue's workers (a
thread of ours still running Python as the interpreter finalizes can abort the process)."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import kopf
import pytest
from kubernetes import client

from mpjob.controller import handlers
from mpjob.controller.cache import ChildCache
from mpjob.controller.cluster import Cluster
from mpjob.controller.config import OperatorConfig
from mpjob.controller.liveness import Liveness
from mpjob.controller.main import serve_metrics
from mpjob.controller.metrics_server import MetricsServer
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob.controller.workqueue import WorkQueue
from mpjob_contract import api
from tests.helpers import free_port

pytestmark = pytest.mark.unit


def controller(metrics: MetricsServer) -> handlers.Controller:
    """The operator's parts as `Controller.assemble` makes them, its clients never used."""
    never = client.ApiClient(client.Configuration())
    custom, batch, core = client.CustomObjectsApi(never), client.BatchV1Api(never), client.CoreV1Api(never)
    cluster = Cluster(custom=custom, batch=batch, core=core)
    config, cache = OperatorConfig(), ChildCache(lambda key: None)
    peering = PeeringCheck(peering=None, cluster=cluster, trust_seconds=1)
    reconciler = Reconciler(config=config, cluster=cluster, cache=cache, peering=peering)
    queue, liveness = WorkQueue(reconciler.handle, workers=1), Liveness(api.PLURAL, cache.dead_watches)
    return handlers.Controller(config, cluster, cache, queue, reconciler, liveness, metrics=metrics)


def test_the_cleanup_stops_the_metrics_server_and_joins_its_thread() -> None:
    port = free_port()
    metrics, refused = serve_metrics(port, "127.0.0.1")
    assert refused is None and metrics is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert b"mpjob_" in answer.read()
    asyncio.run(handlers.stop(memo=kopf.Memo(controller=controller(metrics))))
    assert not metrics.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=30).close()
    assert metrics.stop(1.0) == []  # a second stop (the startup's, cancelled) does nothing more


def test_metrics_port_0_serves_nothing() -> None:
    assert serve_metrics(0, "127.0.0.1") == (None, None)
