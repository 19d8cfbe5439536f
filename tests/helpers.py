"""Checks shared by the tests: tasks and connections the client may have left behind."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from asyncsearch import AsyncSearchClient, _call

#: How many times slower than an idle machine the tests may run. CI's busy run (random order,
#: 4 workers, both cores kept busy) sets ASYNCSEARCH_TEST_TIME_SCALE; every liveness bound
#: (pytest-timeout, a test's asyncio.timeout, a CLI run) is multiplied by it. Bounds only: no
#: test asserts that something is fast.
TIME_SCALE = float(os.environ.get("ASYNCSEARCH_TEST_TIME_SCALE", "1"))

#: Every task the SDK starts is named with this prefix (``asyncsearch.fan_out.worker``, ...).
SDK_TASK_PREFIX = "asyncsearch."


def client_tasks() -> list[asyncio.Task[object]]:
    """Unfinished tasks the SDK started, found by the names it gives them.

    Never by the file a task's code lives in: a checkout cloned into a folder named
    ``asyncsearch`` puts the tests, their servers and the virtualenv's aiohttp under
    ``/asyncsearch/`` too.
    """
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and task.get_name().startswith(SDK_TASK_PREFIX)
    ]


def held_connections(client: AsyncSearchClient) -> int:
    """Connections the client's pool has handed out and not yet got back."""
    session = client._shared.transport._session
    if session is None or session.connector is None:
        return 0
    return len(session.connector._acquired)


def hold_backoff(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold every wait before a retry: ``(waiting, release)``. A call about to wait sets
    ``waiting`` and goes on once the test sets ``release``: no bet on how long a backoff is."""
    waiting, release = asyncio.Event(), asyncio.Event()

    async def backoff(delay: float) -> None:
        waiting.set()
        await release.wait()

    monkeypatch.setattr(_call, "_sleep", backoff)
    return waiting, release


class ThreadedServer:
    """An aiohttp app served from its own thread and event loop.

    For tests where the client blocks its own loop (CPU-bound caller work): a server in the same
    loop could not receive anything meanwhile, so it would hide whether a request really left.
    """

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._stop())
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self._app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = self._runner.addresses
        host, port = sockets[0][:2]
        self.base_url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the threaded server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


# -- shared by the tests of the concurrency layer and of the page walker ----------------------

#: Every way a consumer can leave an async iterator of the SDK.
WAYS_OUT = [
    "exhausted",
    "aclose",
    "async_with",
    "body_exception",
    "cancelled_in_anext",
    "cancelled_in_body",
    "anyio_timeout",
    "break",
]


class Boom(Exception):
    """An error raised on purpose by a fake function."""


@pytest.fixture(autouse=True)
async def no_loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fail the test if asyncio reports anything: a task destroyed while pending, an exception
    never retrieved, a failing finaliser. (Warnings are already errors in the pytest config.)"""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    yield reported
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(previous)
    assert reported == []


def other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)
