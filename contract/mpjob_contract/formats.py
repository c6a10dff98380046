"""The API's string formats: each pattern beside what it allows, in words.

A pattern is checked twice, by the API server (the CRD's `pattern`, RE2) and by the models
(`mpjob validate`, the operator); the words are what `mpjob validate` says instead of the
pattern, with an example. Both come from here, so the message cannot drift from the check.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    #: The regular expression, in RE2 so that the API server checks the same.
    pattern: str
    #: What it allows, as "must be ..." goes on.
    allows: str


#: A job's name: a DNS label starting with a letter (its children's names are built from it).
JOB_NAME = Format(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (gpt-small)",
)
#: A namespace's name: a DNS label.
NAMESPACE = Format(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "lowercase letters, digits and '-', starting and ending with a letter or digit (team-a)",
)
#: Secret names are DNS subdomains.
SECRET_NAME = Format(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    "a Secret's name: lowercase letters, digits, '-' and '.', each part between dots starting and ending "
    "with a letter or digit (s3-credentials)",
)
#: S3's bucket naming rules (3-63 characters, the field's bounds).
BUCKET = Format(
    r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$",
    "a bucket name: lowercase letters, digits, '-' and '.', each part between dots starting and ending "
    "with a letter or digit (training-checkpoints)",
)
#: Segments joined by `/` or `.`; never a `.`/`..` segment, a leading or trailing `/` (the
#: job's folder is appended below it).
PREFIX = Format(
    r"^[A-Za-z0-9_-]+([./][A-Za-z0-9_-]+)*$",
    "parts of letters, digits, '_' and '-' joined by '/' or '.', with no '/' at either end (mpjob/team-a)",
)
#: A TCP port, 1-65535, without leading zeros.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
#: A host name or IPv4 address, or an IPv6 address in brackets; then a port, if any, that exists.
ENDPOINT = Format(
    r"^https?://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(:" + _PORT + r")?(/[A-Za-z0-9._~/-]*)?$",
    "an http:// or https:// URL: a host (an IPv6 address in brackets), an optional port from 1 to 65535 "
    "and an optional path, no query (http://minio.storage:9000)",
)
REGION = Format(r"^[a-z0-9-]+$", "lowercase letters, digits and '-' (us-east-1)")
#: `mlflow:5000` would parse as the scheme `mlflow`, and a bare path would make the trainer
#: write runs into its own container.
MLFLOW_URI = Format(
    r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s]+$",
    "a URI with its scheme and no spaces (http://mlflow.mlflow.svc:5000)",
)
TASK_MODULE = Format(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$",
    "a Python module's dotted path, ':' and a function's name (my_pkg.train:make_task)",
)
COMPUTE_CAPABILITY = Format(r"^[0-9]+\.[0-9]+$", 'major.minor, in quotes in YAML ("8.0")')
QUANTITY = Format(
    r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$",
    "a Kubernetes quantity: a number, or one with a unit (4, 500m, 32Gi)",
)
#: Also a metric label value, so a bounded, plain alphabet.
CURRENCY = Format(r"^[A-Z]{3}$", "an ISO 4217 currency code: three capital letters (EUR, USD)")
#: A module's dotted name (as model.named_modules() gives it) or an fnmatch pattern over it.
FP8_SKIP = Format(
    r"^[A-Za-z0-9_.*?\[\]!-]+$",
    "a module's dotted name or an fnmatch pattern over it: letters, digits, '_', '.', '-' and * ? [ ] ! (layers.0.*)",
)

_ALL = (
    JOB_NAME, NAMESPACE, SECRET_NAME, BUCKET, PREFIX, ENDPOINT, REGION, MLFLOW_URI, TASK_MODULE, COMPUTE_CAPABILITY,
    QUANTITY, CURRENCY, FP8_SKIP,
)  # fmt: skip
_BY_PATTERN = {fmt.pattern: fmt for fmt in _ALL}
assert len(_BY_PATTERN) == len(_ALL), "each format its own pattern: the words are found by it"


def allowed_by(pattern: str | None) -> str | None:
    """What a pattern of the API allows, in words (None: not one of the API's formats)."""
    fmt = _BY_PATTERN.get(pattern or "")
    return fmt.allows if fmt is not None else None
