"""The peering object as kopf itself writes it, read by the operator's peering check.

kopf has no public API that says whether this replica is paused, so `controller/peering.py`
reads the same peering object kopf keeps (`status: {identity: {priority, lifetime, lastseen}}`).
These tests pin that format to the installed kopf: each entry is made by kopf's own `Peer`, as
kopf's keep-alive patches it, and the verdict of `outranked` must be the one kopf's own peering
handler reaches on the same object (pause or act). A kopf release that changes either fails here
before it lets two replicas act at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.engines import peering as kopf_peering

from mpjob.controller.config import Peering
from mpjob.controller.peering import outranked

pytestmark = pytest.mark.unit

NAME, ME, PRIORITY = "mpjob", "mpjob-operator-7d9f-abcde", 100


def written(priority: int, *, seen_ago: float = 0.0, lifetime: int = 60) -> dict[str, Any]:
    """A peer's entry exactly as kopf's keep-alive (`touch`) writes it into the status."""
    lastseen = (datetime.now(UTC) - timedelta(seconds=seen_ago)).isoformat()
    peer = kopf_peering.Peer(
        identity=kopf_peering.Identity("x"), priority=priority, lifetime=lifetime, lastseen=lastseen
    )
    return peer.as_dict()


def kopf_pauses(status: dict[str, Any]) -> bool:
    """What kopf's own peering handler decides for this replica on this object."""
    settings = kopf.OperatorSettings()
    settings.peering.name, settings.peering.priority = NAME, PRIORITY
    event = {"type": "MODIFIED", "object": {"metadata": {"name": NAME}, "status": status}}

    async def decide() -> bool:
        paused, woken = aiotoggles.Toggle(), asyncio.Event()
        woken.set()  # kopf then re-checks on the next event instead of sleeping until a peer expires
        await kopf_peering.process_peering_event(
            raw_event=event,  # type: ignore[arg-type]
            namespace=None,
            resource=None,  # type: ignore[arg-type]
            identity=kopf_peering.Identity(ME),
            settings=settings,
            autoclean=False,
            stream_pressure=woken,
            conflicts_found=paused,
        )
        return paused.is_on()

    return asyncio.run(decide())


def test_an_entry_kopf_writes_has_the_fields_peering_reads() -> None:
    entry = written(7, lifetime=60)
    assert set(entry) == {"priority", "lifetime", "lastseen"}
    assert isinstance(entry["priority"], int) and isinstance(entry["lifetime"], int)
    assert datetime.fromisoformat(entry["lastseen"]).tzinfo is not None


@pytest.mark.parametrize(
    "status",
    [
        {},
        {ME: written(PRIORITY)},  # only this replica
        {ME: written(PRIORITY), "older": written(PRIORITY + 1)},  # a live peer ranks higher: stand by
        {ME: written(PRIORITY), "twin": written(PRIORITY)},  # equal priority: kopf pauses both
        {ME: written(PRIORITY), "newer": written(PRIORITY - 1)},  # a lower peer: act
        {ME: written(PRIORITY), "gone": written(PRIORITY + 1, seen_ago=61)},  # its lifetime passed
        {ME: written(PRIORITY), "short": written(PRIORITY + 1, seen_ago=5, lifetime=3)},  # its own lifetime
        {ME: written(PRIORITY), "dev": written(PRIORITY + 5, seen_ago=30, lifetime=40)},
    ],
)
def test_the_peering_check_decides_as_kopf_does(status: dict[str, Any]) -> None:
    me = Peering(name=NAME, identity=ME, priority=PRIORITY, clusterwide=True)
    assert outranked(status, peering=me, now=datetime.now(UTC)) is kopf_pauses(status)
