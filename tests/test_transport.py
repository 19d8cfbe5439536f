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
    _client,
)
from asyncsearch._transport import _lazy_read_timer, _LazyReadTimer, _PoolSlots

from .conftest import API_KEY, JOB_ID, Handler, Server
from .helpers import ThreadedServer

Serve = Callable[[Handler], Awaitable[Server]]
JOB_BODY = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()

# Every case runs on both aiohttp paths of the client's own session (see conftest.request_path).
pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("request_path")]


@pytest.fixture(autouse=True)
def backoff_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff sleeps are recorded and skipped: a retry shows up here."""
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_client, "_sleep", fake_sleep)
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
            assert info.value.attempts == 1
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


async def test_pool_slots_go_in_order_and_a_cancelled_waiter_passes_its_slot_on() -> None:
    slots = _PoolSlots(1)
    assert slots.try_take()
    assert not slots.try_take()
    order: list[str] = []

    async def wait(name: str) -> None:
        await slots.wait()
        order.append(name)

    first = asyncio.create_task(wait("first"))
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)  # both are in line now
    assert not slots.try_take()  # a newcomer does not jump the line
    slots.give_back()  # handed to `first`...
    first.cancel()  # ...which is cancelled before it runs again: the slot goes to `second`
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert order == ["second"]
    assert not slots.try_take()
    slots.give_back()
    assert slots.try_take()


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
            lambda: client.wait_for_extraction(JOB_ID, timeout=5),
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


# -- the read timeout, kept by one timer per connection ----------------------------------------


class _FakeTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class _FakeClock:
    """Stands in for the loop's clock and timers, so the test decides when time passes."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(when, callback)
        self.timers.append(timer)
        return timer

    def live(self) -> list[float]:
        return [t.when() for t in self.timers if not t.cancelled]

    def fire(self, at: float) -> None:
        """Move to ``at`` and run the live timer due then (there is at most one)."""
        self.now = at
        (due,) = [t for t in self.timers if not t.cancelled and t.when() == at]
        due.cancelled = True  # fired: no longer live
        due.callback()


def _timed_handler(*, read_timeout: float) -> tuple[_LazyReadTimer, _FakeClock]:
    """The client's protocol on a clock the test moves, with ``Timeout(read=read_timeout)``."""
    handler = _LazyReadTimer(loop=asyncio.get_running_loop())
    clock = _FakeClock()
    handler._loop = clock  # type: ignore[assignment]
    handler.read_timeout = read_timeout
    return handler, clock


async def test_the_read_timeout_fires_after_read_seconds_without_data_with_one_timer() -> None:
    handler, clock = _timed_handler(read_timeout=60)
    handler.start_timeout()  # the request is sent
    assert clock.live() == [60]
    for at in (10, 30, 59):  # chunks arrive: no new timer each time, unlike aiohttp's
        clock.now = at
        handler._reschedule_timeout()
    assert clock.live() == [60]
    clock.fire(60)  # data came 1 s ago: wait for the rest
    assert handler.exception() is None
    assert clock.live() == [119]
    clock.fire(119)  # 60 s without data: the timeout aiohttp would raise
    assert isinstance(handler.exception(), aiohttp.SocketTimeoutError)
    assert clock.live() == []


async def test_a_shorter_read_timeout_on_a_reused_connection_is_not_delayed() -> None:
    handler, clock = _timed_handler(read_timeout=60)
    handler.start_timeout()
    clock.now = 1
    handler.read_timeout = 5  # the next request, with Timeout(read=5), before the timer ran
    handler.start_timeout()
    assert clock.live() == [6]
    handler.read_timeout = None  # and one with no read timeout at all
    handler.start_timeout()
    clock.fire(6)
    assert handler.exception() is None
    assert clock.live() == []
    clock.now = 7
    handler.read_timeout = 5
    handler.start_timeout()
    assert clock.live() == [12]
    handler._drop_timeout()  # the answer is read to its end
    clock.fire(12)  # nothing is read any more: no timeout, and the timer stays unset
    assert clock.live() == []
    assert handler.exception() is None


async def test_one_timer_serves_the_answers_of_a_keep_alive_connection() -> None:
    handler, clock = _timed_handler(read_timeout=60)
    for at in (0, 1, 2, 3):  # four answers, each sent, read and ended
        clock.now = at
        handler.start_timeout()
        handler._reschedule_timeout()  # a chunk
        handler._drop_timeout()  # the end of the answer
    assert len(clock.timers) == 1  # made once, never cancelled and made again
    assert clock.live() == [60]
    clock.now = 50
    handler.start_timeout()  # a fifth answer, 10 s before the timer comes due
    clock.fire(60)  # only 10 s without data: set again for the rest
    assert handler.exception() is None
    assert clock.live() == [110]
    clock.fire(110)  # this answer went 60 s without data
    assert isinstance(handler.exception(), aiohttp.SocketTimeoutError)


async def test_an_idle_connection_never_times_out_and_a_lost_one_drops_its_timer() -> None:
    handler, clock = _timed_handler(read_timeout=60)
    handler.start_timeout()
    handler._drop_timeout()
    clock.fire(60)  # idle in the pool when it comes due
    assert handler.exception() is None
    assert clock.live() == []
    clock.now = 500
    handler.start_timeout()  # the next answer sets it again
    assert clock.live() == [560]
    # aiohttp's flow control (pause_reading, resume_reading) calls these two: no timeout while
    # reading is paused, and the full `read` seconds again once it resumes. (Called directly:
    # aiohttp 3.14's pause_reading needs a parser this bare protocol has not got.)
    handler._drop_timeout()
    clock.fire(560)
    assert handler.exception() is None
    clock.now = 600
    handler._reschedule_timeout()
    assert clock.live() == [660]
    handler.connection_lost(None)
    assert clock.live() == []  # cancelled: it neither fires nor keeps the protocol alive


async def test_the_clients_own_connections_use_the_one_timer_protocol(serve: Serve) -> None:
    async def answer(request: web.Request) -> web.Response:
        return job_answer()

    server = await serve(answer)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        await client.get_extraction(JOB_ID)
        session = client._shared.transport._session
        assert session is not None
        connector: Any = session.connector
        assert connector._factory.func is _lazy_read_timer
        # The pooled connection the request went over speaks through it.
        (pooled,) = [proto for conns in connector._conns.values() for proto, _ in conns]
        assert isinstance(pooled, _LazyReadTimer)


async def test_a_stalled_answer_times_out_on_a_connection_that_carried_others(
    serve: Serve,
) -> None:
    """The timer kept from the earlier answers of a keep-alive connection still ends a later
    answer that stops sending in the middle of its body, and no sooner than ``read`` seconds."""
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
