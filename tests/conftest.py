"""Shared fixtures: a scripted loopback HTTP server, and a guard that the key is never logged."""

from __future__ import annotations

import faulthandler
import logging
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from asyncsearch.testing import ServiceEmulator

from .helpers import TIME_SCALE

API_KEY = "sk-test-7f3a9c-DO-NOT-LOG"
JOB_ID = "9b2e4c6a-1d3f-4a5b-8c7d-0e1f2a3b4c5d"
LOG_ID = "4c5d6e7f-8a9b-4c0d-9e1f-2a3b4c5d6e7f"
EMULATOR_KEY = "test-key"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Seconds a test may outlive its pytest-timeout before the whole run is stopped.
HARD_STOP_GRACE = 30.0 * TIME_SCALE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scale every test's pytest-timeout by ``TIME_SCALE`` (see tests/helpers.py)."""
    if TIME_SCALE == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker is not None and marker.args else default
        if seconds:
            item.add_marker(pytest.mark.timeout(seconds * TIME_SCALE), append=False)


def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> None:
    """Arm a hard stop at the test's timeout plus ``HARD_STOP_GRACE`` (beside pytest-timeout's).

    pytest-timeout's signal method raises its failure in whatever frame runs when the alarm
    fires, once. If that frame is a background task (a page prefetch, a server handler), asyncio
    stores the failure in that task and the test runs on: an endless page walk then never ends.
    faulthandler's watchdog is a C thread that needs neither the event loop nor the GIL: it
    prints every thread's stack and exits, so a broken promise fails the run in bounded time.
    """
    timeout = getattr(settings, "timeout", None)
    if timeout:
        faulthandler.dump_traceback_later(timeout + HARD_STOP_GRACE, exit=True, file=sys.__stderr__)


def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    """Disarm the hard stop of ``pytest_timeout_set_timer``."""
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def key_never_logged(caplog: pytest.LogCaptureFixture) -> object:
    """Every test runs with asyncsearch logging at DEBUG and fails if the key shows up in it."""
    caplog.set_level(logging.DEBUG, logger="asyncsearch")
    yield None
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(record.exc_info[1]))
        assert API_KEY not in text, f"the API key leaked into a log record: {record!r}"


@dataclass
class Seen:
    """What a scripted server saw."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """A loopback aiohttp server whose answers a test scripts, recording every request."""

    base_url: str = ""
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    """``server = await serve(handler)`` starts a loopback server answering every path."""
    servers: list[TestServer] = []

    async def start(handler: Handler) -> Server:
        state = Server()

        async def record(request: web.Request) -> web.StreamResponse:
            state.seen.append(
                Seen(
                    method=request.method,
                    path=request.raw_path.split("?", 1)[0],
                    query=dict(request.query),
                    headers=dict(request.headers),
                    body=await request.read(),
                )
            )
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                return await handler(request)
            finally:
                state.in_flight -= 1

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        state.base_url = str(server.make_url("")).rstrip("/")
        return state

    yield start
    for server in servers:
        await server.close()


@pytest_asyncio.fixture
async def http(emu: ServiceEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp session sending the key to ``emu``, which each emulator test module defines
    with its own options."""
    async with aiohttp.ClientSession(
        emu.base_url, headers={"X-Api-Key": EMULATOR_KEY}, timeout=aiohttp.ClientTimeout(total=20)
    ) as session:
        yield session
