"""docs/sdk.md's API table is the Session's: every `run.` method it writes with its parameters
takes as many positional parameters as written, and the keyword-only ones it names, with their
defaults (what a script passes by name and would get a TypeError for); `mpjob.start(...)` too."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mpjob_trainer import session as mpjob

pytestmark = pytest.mark.unit

SDK = Path(__file__).resolve().parents[3] / "docs" / "sdk.md"
#: A table row that names a method with its parameters: | `name(params)` ... | what |
ROW = re.compile(r"^\| `(\w+)\(([^`]*)\)(?: -> \w+)?` \|", re.M)
START = re.compile(r"^`mpjob\.start\(([^`]*)\)` joins", re.M)


def written(params: str) -> tuple[int, dict[str, str | None], bool]:
    """(positional parameters, keyword-only ones with their default or None, takes **) as written."""
    positional, keywords, star, rest = 0, {}, False, False
    for part in [p.strip() for p in re.split(r",\s*(?![^()]*\))", params) if p.strip()]:
        if part == "*":
            star = True
        elif part.startswith("**"):
            rest = True
        elif star:
            name, _, default = part.partition("=")
            keywords[name] = default.replace(" ", "") or None
        else:
            positional += 1
    return positional, keywords, rest


def actual(func: Callable[..., object]) -> tuple[int, dict[str, str | None], bool]:
    """The same of the code's signature (defaults as repr writes them, without spaces)."""
    params = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    keywords = {
        p.name: None if p.default is p.empty else repr(p.default).replace(" ", "")
        for p in params
        if p.kind is p.KEYWORD_ONLY
    }
    return positional, keywords, any(p.kind is p.VAR_KEYWORD for p in params)


def table_rows() -> list[tuple[str, str]]:
    return ROW.findall(SDK.read_text())


def test_the_table_writes_the_methods_with_parameters() -> None:
    names = {name for name, _ in table_rows()}
    assert {"adamw", "wrap", "backward", "step", "end_step", "register_step", "resume", "close"} <= names


@pytest.mark.parametrize(("name", "params"), table_rows(), ids=[name for name, _ in table_rows()])
def test_each_method_the_table_writes_takes_what_it_says(name: str, params: str) -> None:
    method = getattr(mpjob.Session, name, None)
    assert method is not None, f"docs/sdk.md names run.{name}, which the Session lacks"
    assert written(params) == actual(method), f"docs/sdk.md: {name}({params})"


def test_start_takes_what_the_page_says() -> None:
    found = START.search(SDK.read_text())
    assert found is not None
    assert written(found.group(1)) == actual(mpjob.start)
