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
    #: The longest value Kubernetes takes, where it bounds one (None: no bound of its own).
    max_length: int | None = None

    def schema(self) -> dict[str, str | int]:
        """The format as the keys of a schema node (pattern, and maxLength where it has one)."""
        bound = {"maxLength": self.max_length} if self.max_length is not None else {}
        return {"pattern": self.pattern, **bound}


#: Kubernetes' own name rules, as k8s.io/apimachinery/pkg/util/validation spells them.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = _DNS_LABEL + r"(\." + _DNS_LABEL + r")*"
#: A label value, and a qualified name's name part: 63 characters at most, which a pattern says here
#: because a qualified name's prefix has its own bound.
_QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


#: A job's name: a DNS label starting with a letter (its children's names are built from it).
JOB_NAME = Format(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (gpt-small)",
)
#: A DNS label (RFC 1123): a namespace's name, a pod volume's name.
DNS_LABEL = Format(
    f"^{_DNS_LABEL}$",
    "lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit (team-a)",
    max_length=63,
)
NAMESPACE = DNS_LABEL
#: A DNS subdomain (RFC 1123): the name of a Secret, a PersistentVolumeClaim, a ServiceAccount, a
#: PriorityClass.
DNS_SUBDOMAIN = Format(
    f"^{_DNS_SUBDOMAIN}$",
    "a Kubernetes object's name: lowercase letters, digits, '-' and '.', at most 253, each part between "
    "dots starting and ending with a letter or digit (s3-credentials)",
    max_length=253,
)
SECRET_NAME = DNS_SUBDOMAIN
#: A name Kubernetes treats as unset when empty (a pod's serviceAccountName, priorityClassName).
DNS_SUBDOMAIN_OR_EMPTY = Format(
    f"^({_DNS_SUBDOMAIN})?$", DNS_SUBDOMAIN.allows.replace(" (", ", or empty (", 1), max_length=253
)
#: A label's value (also a node selector's, a toleration's, Kueue's queue name label's).
LABEL_VALUE = Format(
    f"^({_QUALIFIED_NAME})?$",
    "a label value: letters, digits, '-', '_' and '.', at most 63, starting and ending with a letter or "
    "digit, or empty (gpu-a100)",
    max_length=63,
)
#: A label's key, or a toleration's (empty there: every taint): an optional DNS subdomain prefix and
#: '/', then a name part of at most 63 characters. 253 + 1 + 63 bounds the whole; the prefix's own
#: 253 is left to Kubernetes (a pattern cannot count the part before the '/').
TOLERATION_KEY = Format(
    f"^(({_DNS_SUBDOMAIN}/)?{_QUALIFIED_NAME})?$",
    "a label key: an optional DNS subdomain and '/', then letters, digits, '-', '_' and '.', at most 63, "
    "starting and ending with a letter or digit; or empty (nvidia.com/gpu)",
    max_length=317,
)
#: A key of a ConfigMap or Secret (IsConfigMapKey): never '.', '..' or starting with '..'.
CONFIG_KEY = Format(
    r"^[.]?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$",
    "a ConfigMap or Secret key: letters, digits, '-', '_' and '.', at most 253, not starting with '..' (token.json)",
    max_length=253,
)
#: An environment variable's name: printable ASCII but '=' (Kubernetes 1.34's relaxed rule, GA).
ENV_VAR_NAME = Format(r"^[ -<>-~]+$", "printable ASCII characters other than '=' (MY_SETTING)")
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
#: A container image reference as the kubelet parses it (github.com/distribution/reference's grammar,
#: which k8s.io/kubernetes/pkg/util/parsers uses): an optional registry host and port, a lowercase
#: repository path, an optional tag and digest. What the grammar leaves to code is left to the
#: kubelet: a path past 255 characters, a digest's algorithm and length, a bare 64-hex name. Empty
#: is the operator's default image, as unset.
_HOST = (
    r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:[.](?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
)
_PATH = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
IMAGE = Format(
    rf"^((?:(?:{_HOST}|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?{_PATH}(?:/{_PATH})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?)?$",
    "an image reference: [registry[:port]/]repository[:tag][@digest], the repository in lowercase letters, "
    "digits and '.', '_', '-' between them, the tag of letters, digits, '_', '.' and '-'; or empty for the "
    "operator's default (ghcr.io/team/trainer:1.4)",
)
#: resource.ParseQuantity's grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go), not the
#: looser regular expression its error quotes ("1.2.3" and "4KiB" match that one, and fail to
#: parse), with no '-': every quantity the pod API takes (requests, limits, an emptyDir's
#: sizeLimit, a divisor) must be at least 0. Degenerate forms ParseQuantity reads as 0 ("+",
#: "Ki", "-0") are left out.
QUANTITY = Format(
    r"^[+]?([0-9]+([.][0-9]*)?|[.][0-9]*)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$",
    "a Kubernetes quantity of at least 0: a number with an optional suffix, one of Ki Mi Gi Ti Pi Ei, "
    "n u m k M G T P E, or an exponent e<N> (4, 500m, 1.5Gi, 1e3)",
)
#: Also a metric label value, so a bounded, plain alphabet.
CURRENCY = Format(r"^[A-Z]{3}$", "an ISO 4217 currency code: three capital letters (EUR, USD)")
#: A module's dotted name (as model.named_modules() gives it) or an fnmatch pattern over it.
FP8_SKIP = Format(
    r"^[A-Za-z0-9_.*?\[\]!-]+$",
    "a module's dotted name or an fnmatch pattern over it: letters, digits, '_', '.', '-' and * ? [ ] ! (layers.0.*)",
)
#: precision.keepFp32: a module type's (class's) name, as Python names it.
MODULE_TYPE = Format(
    r"^[A-Za-z_][A-Za-z0-9_]*$",
    "a module type's (class's) name: letters, digits and '_', not starting with a digit (LayerNorm)",
)

_ALL = (
    JOB_NAME, DNS_LABEL, DNS_SUBDOMAIN, DNS_SUBDOMAIN_OR_EMPTY, LABEL_VALUE, TOLERATION_KEY, CONFIG_KEY, ENV_VAR_NAME,
    BUCKET, PREFIX, ENDPOINT, REGION, MLFLOW_URI, TASK_MODULE, COMPUTE_CAPABILITY, IMAGE, QUANTITY, CURRENCY,
    FP8_SKIP, MODULE_TYPE,
)  # fmt: skip
_BY_PATTERN = {fmt.pattern: fmt for fmt in _ALL}
assert len(_BY_PATTERN) == len(_ALL), "each format its own pattern: the words are found by it"


#: YAML 1.1, which kubectl and PyYAML read, takes these words unquoted as booleans.
YAML_BOOLEANS = "YAML reads an unquoted on, off, yes, no, y, n, true or false as a boolean"


def quoting_hint(value: object) -> str:
    """What YAML made of an unquoted value given where a string belongs, and how to write it
    (" (...: put it in quotes ...)"; "" when it is no boolean or number): the spec's fields and
    the template's pod fields say it alike."""
    if isinstance(value, bool):
        return f" ({YAML_BOOLEANS}: put the value in quotes)"
    if isinstance(value, int | float):
        return f' (YAML read it as the number {value}: put it in quotes, "{value}")'
    return ""


def allowed_by(pattern: str | None) -> str | None:
    """What a pattern of the API allows, in words (None: not one of the API's formats)."""
    fmt = _BY_PATTERN.get(pattern or "")
    return fmt.allows if fmt is not None else None


def whole_number(text: str, *, digits: int = 18) -> int | None:
    """The whole number `text` spells in at most `digits` ASCII digits (no sign, no spaces), else
    None. `str.isdigit` alone also takes other scripts' digits (a superscript two, a circled one,
    full-width ones), which int() refuses, or reads, and past 4300 digits int() refuses any: a
    value from a pod, an annotation, a server or the environment checked that way raised where
    its reader refuses it in words."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= digits else None
