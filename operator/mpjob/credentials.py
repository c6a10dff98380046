"""Reaching a cluster from `mpjob status` and `mpjob operator`.

A kubeconfig the client cannot use, or a cluster that does not answer, is one line for the user
(`NoCluster`), said within seconds: never a traceback, and never an operator that starts its
watches against nothing and retries them forever. The Kubernetes client raises whatever its
parsing met (its ConfigException, a YAML error, a TypeError for a list where a mapping belongs,
UnicodeDecodeError for a file that is not text), so all of them are caught here, in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.util.retry import Retry

#: Connect and read timeouts of a request that checks the cluster answers (seconds).
REQUEST_TIMEOUT = (5, 20)
#: What the client raises for a kubeconfig it cannot use (UnicodeDecodeError is a ValueError).
_UNUSABLE = (config.ConfigException, OSError, yaml.YAMLError, TypeError, KeyError, AttributeError, ValueError)
UNAUTHORIZED = 401
#: The client's own retries: a refused connection is tried twice more at once, but a request the
#: server took and never answered is not sent again unseen (urllib3 would, three times: minutes of
#: silence at a 30-s read timeout). Callers retry with their own backoff, and say so.
RETRIES = Retry(total=2, read=0, redirect=0, status=0)


class NoCluster(Exception):
    """No cluster to talk to: the message says why, in one line, for the user."""


def _why(exc: BaseException) -> str:
    """What is wrong with a kubeconfig, in one line."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    if isinstance(exc, yaml.YAMLError):
        return "not YAML: " + "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, config.ConfigException):
        return str(exc)
    return f"not a kubeconfig ({type(exc).__name__}: {exc})"


@contextlib.contextmanager
def reading_kubeconfig() -> Iterator[None]:
    """Whatever the client raises while it reads a kubeconfig, as NoCluster."""
    try:
        yield
    except _UNUSABLE as exc:
        raise NoCluster(f"no usable kubeconfig ({_why(exc)})") from exc


def unreachable(host: str, exc: BaseException) -> NoCluster:
    """What is said of a request the cluster at `host` never answered."""
    return NoCluster(f"cannot reach the cluster at {host}: {type(exc).__name__}")


def load_default() -> None:
    """The client's default credentials: the pod's ServiceAccount, else the kubeconfig
    ($KUBECONFIG, else ~/.kube/config), with RETRIES; NoCluster when neither is usable."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        with reading_kubeconfig():
            config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.retries = RETRIES
    client.Configuration.set_default(configuration)


def check_answers() -> None:
    """One request to the cluster of the default credentials, not retried: NoCluster when it
    does not answer or refuses the credentials (any other answer means it is there). /version
    needs no RBAC rule: every client may read it (system:public-info-viewer)."""
    configuration = client.Configuration.get_default_copy()
    configuration.retries = 0
    with client.ApiClient(configuration) as api_client:
        try:
            client.VersionApi(api_client).get_code(_request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == UNAUTHORIZED:
                raise NoCluster(
                    f"the cluster at {configuration.host} refused the credentials: 401 Unauthorized"
                ) from exc
        except Exception as exc:  # urllib3's connection, TLS and timeout errors
            raise unreachable(configuration.host, exc) from exc


def reach() -> None:
    """Load the default credentials and check that their cluster answers (NoCluster: why not)."""
    load_default()
    check_answers()
