"""What a pydantic error of a manifest says, in the manifest's words: the field as written, the
value given and what is allowed there.

Pydantic's own text names neither the value nor the other bound ("Input should be greater than
or equal to 1"), and an unknown field's error names no field that would do. Both are looked up
in the API models themselves (the models the CRD is generated from), along the error's location:
a misspelt field gets the closest allowed names, a bound gets the field's whole range.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mpjob_contract import formats
from mpjob_contract.api import MixedPrecisionJob
from mpjob_contract.spelling import did_you_mean, key

#: An unknown field with no close name lists the allowed ones when there are at most this many.
MAX_LISTED = 16
_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def message(error: Any, loc: tuple[Any, ...]) -> str:
    """The words for one pydantic error at `loc` (its location without union members' tags)."""
    return _plain(error, loc) + _scalar_hint(error)


def _plain(error: Any, loc: tuple[Any, ...]) -> str:
    msg, kind, ctx = str(error["msg"]).removeprefix("Value error, "), error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return unknown_field(loc)
    if kind == "missing":
        return "required field is missing"
    if kind in _BOUNDS:
        return f"must be {allowed_range(loc, ctx)}, got {error.get('input')!r}"
    if kind == "string_pattern_mismatch" and (words := formats.allowed_by(ctx.get("pattern"))):
        return f"must be {words}, got {error.get('input')!r}"
    if "expected" in ctx and kind in ("literal_error", "enum"):
        return f"must be one of {ctx['expected']}, got {error.get('input')!r}"
    if kind == "too_long" and isinstance(error.get("input"), dict | list):
        return f"at most {ctx.get('max_length')} entries allowed, got {len(error['input'])}"
    if kind in ("string_too_short", "string_too_long"):
        return f"{msg}, got {len(str(error.get('input')))} characters"
    if kind in _SHAPES:
        return f"must be {_shape(kind, loc)}, got {error.get('input')!r}"
    return msg


#: What a value of the wrong shape is told the field takes (pydantic's words name a Python class).
_SHAPES = {
    "list_type": "a list ([a, b], or one `- item` per line)",
    "dict_type": "a mapping (`name: value` lines indented below it, or {name: value})",
    "model_type": "a mapping (`name: value` lines indented below it, or {name: value})",
    "string_type": "a string",
}


def _shape(kind: str, loc: tuple[Any, ...]) -> str:
    """'a list ...'; an object's fields named when they are few enough to list."""
    fields = allowed_fields(loc) if kind == "model_type" else []
    if fields and len(fields) <= MAX_LISTED:
        return f"a mapping of its fields ({', '.join(fields)})"
    return _SHAPES[kind]


def _scalar_hint(error: Any) -> str:
    """What YAML did to a value that should have been a string ("" when it did nothing)."""
    value, kind = error.get("input"), error["type"]
    if kind == "string_type" or (isinstance(value, bool) and kind in ("literal_error", "enum")):
        return formats.quoting_hint(value)
    return ""


def unknown_field(loc: tuple[Any, ...]) -> str:
    """An unknown field's message: the allowed names closest to it, else (a short list) all of them."""
    name, allowed = str(loc[-1]), allowed_fields(loc[:-1])
    said = "unknown field (not allowed by the MixedPrecisionJob schema"
    if not allowed:
        return said + ")"
    by_key = {key(field): field for field in allowed}
    if "_" in name.strip("_") and key(name) in by_key:  # run_policy: the Python name
        return f"{said}; its names are camelCase: {by_key[key(name)]})"
    if close := did_you_mean(name, allowed):
        return f"{said}; {close})"
    if len(allowed) <= MAX_LISTED:
        return f"{said}; allowed here: {', '.join(allowed)})"
    return said + ")"


def allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """The field names (as the manifest writes them) of the object at `loc`; [] when not a model."""
    names: list[str] = []
    for model in _models(_types_at(loc)):
        names += [f.alias or n for n, f in model.model_fields.items() if (f.alias or n) not in names]
    return names


def allowed_range(loc: tuple[Any, ...], ctx: dict[str, Any]) -> str:
    """What a bounded number at `loc` may be: 'from 1 to 256', 'greater than 0 and at most 10'."""
    field = _field_at(loc)
    limits = [m for m in (field.metadata if field else []) if isinstance(m, Ge | Gt | Le | Lt)]
    limits = limits or [{"ge": Ge, "gt": Gt, "le": Le, "lt": Lt}[k](v) for k, v in ctx.items() if k in _WORDS]
    low = next((m for m in limits if isinstance(m, Ge | Gt)), None)
    high = next((m for m in limits if isinstance(m, Le | Lt)), None)
    if isinstance(low, Ge) and isinstance(high, Le):
        return f"from {low.ge} to {high.le}"
    return " and ".join(_bound(m) for m in (low, high) if m is not None)


_WORDS = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}


def _bound(limit: Ge | Gt | Le | Lt) -> str:
    bound = type(limit).__name__.lower()
    return f"{_WORDS[bound]} {getattr(limit, bound)}"


def _field_at(loc: tuple[Any, ...]) -> FieldInfo | None:
    """The model field at `loc` (its last part a field name), None when no model names it."""
    if not loc or not isinstance(loc[-1], str):
        return None
    for model in _models(_types_at(loc[:-1])):
        for name, field in model.model_fields.items():
            if loc[-1] in (field.alias, name):
                return field
    return None


def _types_at(loc: tuple[Any, ...]) -> list[Any]:
    """The annotations the value at `loc` may have, walking the models from MixedPrecisionJob."""
    now: list[Any] = [MixedPrecisionJob]
    for part in loc:
        below: list[Any] = []
        for kind in _members(now):
            origin, args = get_origin(kind), get_args(kind)
            if isinstance(part, int) and origin in (list, tuple) and args:
                below.append(args[0])
            elif isinstance(part, str) and origin is dict and len(args) == 2:
                below.append(args[1])
            elif isinstance(part, str) and isinstance(kind, type) and issubclass(kind, BaseModel):
                below += [f.annotation for n, f in kind.model_fields.items() if part in (f.alias, n)]
        now = below
    return now


def _members(kinds: list[Any]) -> list[Any]:
    """`kinds` with unions opened and Annotated unwrapped."""
    out: list[Any] = []
    for kind in kinds:
        origin = get_origin(kind)
        if origin is Annotated:
            out += _members([get_args(kind)[0]])
        elif origin in (Union, types.UnionType):
            out += _members(list(get_args(kind)))
        else:
            out.append(kind)
    return out


def _models(kinds: list[Any]) -> list[type[BaseModel]]:
    return [k for k in _members(kinds) if isinstance(k, type) and issubclass(k, BaseModel)]
