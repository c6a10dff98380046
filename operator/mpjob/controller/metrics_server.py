"""The operator's own metrics endpoint (--metrics-port), and its stop.

Its Service is reachable from every pod of the cluster, tenants' included, so it is served by
the bounded server both metrics endpoints share (mpjob_contract.http_serving), not by
prometheus_client's `start_http_server`, whose threads an idle connection holds for ever.
It serves from a daemon thread nothing else stops. A thread of ours still running
Python while the interpreter finalizes can abort the process (`handlers.STOP_JOIN_SECONDS`), so
`mpjob operator`, which starts it, shuts it down and joins its thread once kopf has returned or
failed (`main.stop_metrics`), as kopf's cleanup joins the operator's other threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, make_wsgi_app

from mpjob_contract import http_serving

#: The name of the thread that serves the metrics (named in the stop's log while it runs on).
THREAD_NAME = "mpjob-metrics"


@dataclass(frozen=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @classmethod
    def start(cls, port: int, bind_address: str) -> MetricsServer:
        """The operator's metrics served on `bind_address`:`port` (OSError: it cannot listen there)."""
        server, thread = http_serving.serve(bind_address, port, make_wsgi_app(REGISTRY), thread_name=THREAD_NAME)
        return cls(server, thread)

    def stop(self, timeout: float) -> list[str]:
        """Stop serving and close the socket (again: nothing more); the thread's name if it
        outlives `timeout`. A scrape under way ends in its own daemon thread."""
        self.server.shutdown()  # returns once serve_forever's loop has ended (it polls every 0.5 s)
        self.server.server_close()
        self.thread.join(timeout)
        return [self.thread.name] if self.thread.is_alive() else []
