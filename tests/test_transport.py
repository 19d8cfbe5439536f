"""The transport over real loopback sockets: the pool's own wait, error bodies, event loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from asyncsearch import (
    APITimeoutError,
    AsyncSearchClient,
    ClientClosedError,
    ConfigurationError,
    InternalServerError,
    NotFoundError,
    PoolTimeoutError,
    RetryBudget,
    Timeout,
    _call,
)
from asyncsearch._concurrency import Slots
from asyncsearch._transport import Transport, _wait_for

from .conftest import API_KEY, JOB_ID, Handler, Server
from .helpers import TIME_SCALE, ThreadedServer, turns

Serve = Callable[[Handler], Awaitable[Server]]
JOB_BODY = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def backoff_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff sleeps are recorded and skipped: a retry shows up here."""
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)
    return delays


def job_answer() -> web.Response:
    return web.Response(body=JOB_BODY, content_type="application/json")


# -- waiting for a pooled connection ---------------------------------------------------------------


async def test_no_free_connection_within_pool_is_a_pool_timeout_never_sent_retried_or_charged(
    serve: Serve, backoff_sleeps: list[float]
) -> None:
    arrived = 0
    pool_full = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            pool_full.set()
        await release.wait()
        return job_answer()

    server = await serve(handler)
    budget = RetryBudget()
    try:
        async with AsyncSearchClient(
            API_KEY,
            base_url=server.base_url,
            max_connections=2,
            retry_budget=budget,
            timeout=Timeout(pool=0.05),
        ) as client:
            held = [asyncio.create_task(client.get_extraction(JOB_ID)) for _ in range(2)]
            await pool_full.wait()  # both connections are in use until the test says so
            with pytest.raises(PoolTimeoutError) as info:
                await client.get_extraction(JOB_ID)
            assert isinstance(info.value, APITimeoutError)
            assert not info.value.retryable
            assert not info.value.request_sent  # the server cannot have acted on it
            assert info.value.attempts == 0  # none went out
            assert "pool" in str(info.value)
            assert "total timeout" not in str(info.value)
            assert len(server.seen) == 2  # never sent
            assert backoff_sleeps == []  # never retried
            assert budget.tokens == budget.capacity  # never charged
            release.set()
            jobs = await asyncio.gather(*held)
            # The slot the timed-out call waited for was not lost: both connections still serve.
            jobs += await asyncio.gather(*(client.get_extraction(JOB_ID) for _ in range(2)))
    finally:
        release.set()
    assert [job.id for job in jobs] == [JOB_ID] * 4
    assert len(server.seen) == 4


async def test_waiting_for_the_pool_does_not_count_against_total(
    serve: Serve, backoff_sleeps: list[float]
) -> None:
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if not first_in.is_set():
            first_in.set()
            await release.wait()
        return job_answer()

    server = await serve(handler)
    budget = RetryBudget()
    total = 1.0
    try:
        async with AsyncSearchClient(
            API_KEY,
            base_url=server.base_url,
            max_connections=1,
            max_retries=0,
            retry_budget=budget,
            timeout=Timeout(total=total, pool=None),
        ) as client:
            holder = asyncio.create_task(
                client.with_options(timeout=Timeout(total=None)).get_extraction(JOB_ID)
            )
            await first_in.wait()  # the only connection is taken until the test releases it
            queued = [asyncio.create_task(client.get_extraction(JOB_ID)) for _ in range(3)]
            # Not a race: the queued calls cannot get a connection before `release`, so they all
            # wait longer than their whole total. Waiting is not the server's fault.
            await asyncio.sleep(total * 1.5)
            assert not any(task.done() for task in queued)
            release.set()
            jobs = await asyncio.gather(holder, *queued)
    finally:
        release.set()
    assert [job.id for job in jobs] == [JOB_ID] * 4
    assert len(server.seen) == 4  # each call sent exactly once
    assert backoff_sleeps == []
    assert budget.tokens == budget.capacity


async def test_the_pool_serves_waiters_in_order_and_a_cancelled_waiter_loses_no_connection(
    serve: Serve,
) -> None:
    first_in = asyncio.Event()
    release = asyncio.Event()
    arrived: list[str] = []
    ids = [f"{JOB_ID[:-1]}{n}" for n in range(5)]

    async def handler(request: web.Request) -> web.StreamResponse:
        arrived.append(request.path.rsplit("/", 1)[-1])
        if not first_in.is_set():
            first_in.set()
            await release.wait()
        return job_answer()

    server = await serve(handler)
    try:
        async with (
            asyncio.timeout(10 * TIME_SCALE),  # a lost connection would wait forever
            AsyncSearchClient(
                API_KEY, base_url=server.base_url, max_connections=1, timeout=Timeout(pool=None)
            ) as client,
        ):
            holder = asyncio.create_task(client.get_extraction(ids[0]))
            await first_in.wait()  # the only connection is taken until the test releases it
            queued = [asyncio.create_task(client.get_extraction(i)) for i in ids[1:4]]
            for _ in range(3):  # each task runs up to its wait for the pool: no I/O before it
                await asyncio.sleep(0)
            queued[1].cancel()  # the middle one leaves the line
            release.set()
            await asyncio.gather(holder, queued[0], queued[2])
            assert queued[1].cancelled()
            # The connection the cancelled call waited for was not lost: the pool still serves.
            await client.get_extraction(ids[4])
    finally:
        release.set()
    assert arrived == [ids[0], ids[1], ids[3], ids[4]]  # first come, first served


@pytest.mark.parametrize("raw", [False, True])
async def test_cancelling_a_call_in_flight_gives_its_connection_back_to_the_pool(
    serve: Serve, raw: bool
) -> None:
    """A call holding the only connection is cancelled while the server holds its answer: the
    next call gets the connection at once (a lost one would end in PoolTimeoutError)."""
    arrived = asyncio.Event()
    gate = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if not arrived.is_set():
            arrived.set()
            await gate.wait()  # the first call's answer waits for the test
        return job_answer()

    server = await serve(handler)
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=server.base_url, max_connections=1, timeout=Timeout(pool=0.2)
        ) as client:
            calls = client.with_raw_response if raw else client
            stuck = asyncio.create_task(calls.get_extraction(JOB_ID))
            await arrived.wait()  # sent: it holds the pool's only connection
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            for _ in range(2):  # and the call after it gives it back in turn
                job = await client.get_extraction(JOB_ID)
                assert job.id == JOB_ID
    finally:
        gate.set()
    assert len(server.seen) == 3


# -- error bodies that cannot be decoded -----------------------------------------------------------


@pytest.mark.parametrize(
    ("inflating_session", "encoding", "body"),
    [
        (False, "br", b"\x8b\x02\x80not really brotli"),
        (False, "x-unknown", b"whatever"),
        (False, "gzip", b"this is not gzip data"),
        (True, "gzip", b"this is not gzip data"),
        (True, "x-unknown", b"whatever"),
    ],
    ids=["sdk-br", "sdk-unknown", "sdk-corrupt-gzip", "callers-corrupt-gzip", "callers-unknown"],
)
async def test_an_undecodable_error_body_keeps_the_status_and_only_loses_its_message(
    serve: Serve, inflating_session: bool, encoding: str, body: bytes
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        status = 404 if "webhook-logs" in request.path else 503
        return web.Response(status=status, body=body, headers={"Content-Encoding": encoding})

    server = await serve(handler)
    async with contextlib.AsyncExitStack() as stack:
        options: dict[str, Any] = {}
        if inflating_session:
            options["session"] = await stack.enter_async_context(aiohttp.ClientSession())
        client = await stack.enter_async_context(
            AsyncSearchClient(API_KEY, base_url=server.base_url, **options)
        )
        with pytest.raises(InternalServerError) as retried:
            await client.get_extraction(JOB_ID)
        with pytest.raises(NotFoundError) as final:
            await client.list_webhook_logs(JOB_ID)
    assert retried.value.status_code == 503
    assert retried.value.attempts == 3  # a 503 is retried as always
    assert final.value.attempts == 1
    for error in (retried.value, final.value):
        assert error.body is None
    assert len(server.seen) == 4


# -- event loops -----------------------------------------------------------------------------------


def test_aclose_from_another_event_loop_raises_and_closes_nothing() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return job_answer()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    with ThreadedServer(app) as server:
        client = AsyncSearchClient(API_KEY, base_url=server.base_url)
        first = asyncio.new_event_loop()
        try:
            job = first.run_until_complete(client.get_extraction(JOB_ID))
            assert job.id == JOB_ID
            session = client._shared.transport._session
            assert session is not None
            assert session.connector is not None
            pooled = [proto for conns in session.connector._conns.values() for proto, _ in conns]
            assert len(pooled) == 1
            assert pooled[0].transport is not None
            socket_transport = pooled[0].transport

            async def close_here() -> None:
                await client.aclose()

            with pytest.raises(ClientClosedError, match="another event loop"):
                asyncio.run(close_here())
            assert not client.is_closed
            assert not socket_transport.is_closing()
            # Closing from the loop it belongs to still works, and closes the socket.
            first.run_until_complete(close_here())
            assert client.is_closed
            assert socket_transport.is_closing()
            assert session.closed
            first.run_until_complete(asyncio.sleep(0))  # let the socket's close run
        finally:
            first.close()


def test_under_trio_every_entry_point_says_asyncio_only() -> None:
    async def main() -> list[BaseException]:
        client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", max_retries=0)
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: client.get_extraction(JOB_ID),
            lambda: client.wait_for_extraction(JOB_ID, max_wait=5),
            lambda: client.search_pages("x").__anext__(),
            lambda: client.search_hits("x", prefetch=False).__anext__(),
            lambda: client.iter_extractions([JOB_ID]).__anext__(),
            lambda: client.gather_extractions([JOB_ID]),
        ]
        errors: list[BaseException] = []
        for call in calls:
            try:
                await call()
            except BaseException as exc:
                errors.append(exc)
        await client.aclose()
        return errors

    errors = anyio.run(main, backend="trio")
    assert len(errors) == 6
    for error in errors:
        assert isinstance(error, ConfigurationError), repr(error)
        assert "asyncio only" in str(error)


# -- the read timeout on a keep-alive connection ---------------------------------------------------


async def test_a_stalled_answer_times_out_on_a_connection_that_carried_others(
    serve: Serve,
) -> None:
    """A later answer of a keep-alive connection that stops sending in the middle of its body
    times out, and no sooner than ``read`` seconds."""
    release = asyncio.Event()
    peers: list[object] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if len(peers) <= 3:
            return job_answer()
        stalled = web.StreamResponse(headers={"Content-Type": "application/json"})
        stalled.content_length = 1000
        await stalled.prepare(request)
        await stalled.write(b'{"id": "')
        await release.wait()  # never sends the rest while the client waits
        return stalled

    server = await serve(answer)
    read = 0.2
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=server.base_url, timeout=Timeout(read=read), max_retries=0
        ) as client:
            for _ in range(3):
                await client.get_extraction(JOB_ID)
            started = asyncio.get_running_loop().time()
            with pytest.raises(APITimeoutError):
                await client.get_extraction(JOB_ID)
            waited = asyncio.get_running_loop().time() - started
    finally:
        release.set()
    assert len(set(peers)) == 1, peers  # all four over one connection
    assert waited >= read


# --------------------------------------------------------------------------------------------
# The pool: waiting for a connection happens inside it (as in httpcore), first come first served


async def _acquire(pool: Slots, limit: float | None) -> None:
    """Take a connection of ``pool`` as ``Transport.send`` does, waiting at most ``limit``."""
    if not pool.take():
        await _wait_for(pool, limit)


async def _free_connections(pool: Slots) -> int:
    """How many connections ``pool`` gives without waiting (taken, then given back)."""
    taken = 0
    while True:
        try:
            await _acquire(pool, 0.01)  # nobody releases meanwhile: a full pool times out
        except PoolTimeoutError:
            break
        taken += 1
    for _ in range(taken):
        pool.release()
    return taken


@pytest.mark.parametrize("way_out", ["cancelled waiting", "cancelled as it is handed one"])
async def test_a_waiter_of_the_pool_stopped_loses_no_connection_and_makes_none(
    way_out: str,
) -> None:
    pool = Slots(1)
    await _acquire(pool, None)  # the only connection, without waiting
    first = asyncio.create_task(_acquire(pool, None))
    second = asyncio.create_task(_acquire(pool, None))
    await turns(3)
    assert not first.done()
    assert not second.done()
    if way_out == "cancelled waiting":
        first.cancel()
        await turns(3)
        pool.release()  # goes to the next in line, not to the one that left
    else:
        pool.release()  # handed to the first in line ...
        first.cancel()  # ... which is stopped before it runs: it hands the connection on
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(10 * TIME_SCALE):
        await second  # the second in line has it
    assert await _free_connections(pool) == 0  # one connection in all: the second's
    pool.release()
    assert await _free_connections(pool) == 1


async def test_the_pool_times_a_direct_wait_out_and_closing_ends_every_wait() -> None:
    transport = Transport(None, 1, False, None, None)
    pool = transport.pool
    assert pool is not None
    await _acquire(pool, None)
    with pytest.raises(PoolTimeoutError, match=r"max_connections=1.*Timeout.pool=0.01s"):
        await _acquire(pool, 0.01)
    bulk = asyncio.create_task(_acquire(pool, None))  # no limit: waits until it has one
    direct = asyncio.create_task(_acquire(pool, 60))
    await turns(3)
    await transport.aclose()
    errors = []
    for waiter in (bulk, direct):
        with pytest.raises(ClientClosedError, match="closed while the request waited") as caught:
            await waiter
        errors.append(caught.value)
    assert errors[0] is not errors[1]  # an error of its own each: no traceback shared
    pool.release()
    assert await _free_connections(pool) == 1  # the timed-out and closed waits took nothing
