"""Bulk extraction fetching and waiting over a loopback server: nothing dropped, nothing leaked."""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from asyncsearch import (
    IN_PROGRESS_JOB_STATES,
    APIStatusError,
    AsyncSearchClient,
    AuthenticationError,
    ExtractionFailure,
    ExtractionJob,
    ExtractionResult,
    ExtractionSuccess,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PoolTimeoutError,
    RateLimitError,
    RetryBudget,
    Timeout,
    WaitTimeoutError,
    _call,
    _client,
)

from .conftest import API_KEY, Handler, Server
from .helpers import TIME_SCALE, client_tasks, held_connections, hold_backoff

Serve = Callable[[Handler], Awaitable[Server]]
SAMPLE_JOB = json.loads((Path(__file__).parent / "samples" / "extraction_job.json").read_text())

pytestmark = pytest.mark.timeout(30)


def job_ids(n: int) -> list[str]:
    return [str(uuid.UUID(int=i + 1, version=4)) for i in range(n)]


def job_body(job_id: str, state: str = "done") -> dict[str, object]:
    return {**SAMPLE_JOB, "id": job_id, "state": state}


def extract_handler(
    *,
    latency: float = 0.0,
    script: dict[str, list[int]] | None = None,
    default: int = 200,
    headers: dict[int, dict[str, str]] | None = None,
) -> Handler:
    """Answers GET /v2/extract/{id}: a scripted status sequence per id, else ``default``."""
    script = script or {}

    async def handler(request: web.Request) -> web.StreamResponse:
        job_id = request.path.rsplit("/", 1)[1]
        if latency:
            await asyncio.sleep(latency)
        statuses = script.get(job_id)
        status = statuses.pop(0) if statuses else default
        if status == 200:
            return web.json_response(job_body(job_id))
        return web.json_response(
            {"error": {"message": f"status {status}"}},
            status=status,
            headers=(headers or {}).get(status),
        )

    return handler


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)
    return delays


async def test_gather_returns_every_id_once_in_order_with_typed_errors(
    serve: Serve, no_backoff: list[float]
) -> None:
    ids = job_ids(60)
    script = {
        ids[3]: [404],
        ids[7]: [500, 200],
        ids[11]: [429, 200],
        ids[13]: [503, 503, 503],
        ids[17]: [200, 404],  # fetched twice below: the second occurrence gets 404
    }
    server = await serve(extract_handler(script=script, headers={429: {"Retry-After": "0"}}))
    wanted: list[str | uuid.UUID] = [*ids, ids[17], "not-a-uuid", uuid.UUID(ids[20])]
    progress: list[tuple[int, int | None]] = []
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        results = await client.gather_extractions(
            wanted, concurrency=8, on_progress=lambda d, t: progress.append((d, t))
        )
    assert [r.job_id for r in results] == wanted
    by_position = dict(enumerate(results))
    assert isinstance(by_position[3].error, NotFoundError)
    assert by_position[3].job is None
    assert by_position[7].ok
    assert by_position[7].job is not None
    assert by_position[11].ok
    assert isinstance(by_position[13].error, InternalServerError)
    assert by_position[13].error.attempts == 3
    assert by_position[17].ok
    assert isinstance(results[60].error, NotFoundError)  # the duplicate, fetched again
    assert isinstance(results[61].error, InvalidRequestError)
    assert results[62].ok
    assert results[62].job_id == uuid.UUID(ids[20])  # exactly as given
    for result in results:
        assert isinstance(result, ExtractionResult)
        assert isinstance(result, ExtractionSuccess if result.ok else ExtractionFailure)
        assert (result.job is None) != (result.error is None)
        if result.job is not None:
            assert isinstance(result.job, ExtractionJob)
            assert result.job.id == str(result.job_id)
        # A success, kept by the thousand, is no work for the cyclic GC; a failure, whose
        # error's traceback can lead back to it, is.
        assert gc.is_tracked(result) is (not result.ok)
    assert progress[-1] == (63, 63)
    assert [d for d, _ in progress] == list(range(1, 64))


async def test_concurrency_is_never_exceeded(serve: Serve) -> None:
    server = await serve(extract_handler(latency=0.005))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        results = [r async for r in client.iter_extractions(job_ids(400), concurrency=7)]
    assert len(results) == 400
    assert all(r.ok for r in results)
    assert len(server.seen) == 400
    assert server.max_in_flight == 7


@pytest.mark.parametrize("ordered", [False, True])
async def test_iter_extractions_yields_every_failed_id_once_with_its_error(
    serve: Serve, no_backoff: list[float], ordered: bool
) -> None:
    ids = job_ids(40)
    script = {ids[i]: [404] for i in (2, 9, 31)} | {ids[i]: [500, 500, 500] for i in (5, 20)}
    server = await serve(extract_handler(script=script))
    wanted: list[str] = [*ids, "not-a-uuid"]
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=2) as client:
        results = [r async for r in client.iter_extractions(wanted, concurrency=6, ordered=ordered)]
    assert sorted(str(r.job_id) for r in results) == sorted(wanted)  # each id exactly once
    failed = {str(r.job_id): r.error for r in results if not r.ok}
    assert set(failed) == {ids[2], ids[9], ids[31], ids[5], ids[20], "not-a-uuid"}
    for i in (2, 9, 31):
        assert isinstance(failed[ids[i]], NotFoundError)
    for i in (5, 20):
        assert isinstance(failed[ids[i]], InternalServerError)
        assert failed[ids[i]].attempts == 3  # type: ignore[union-attr]
    assert isinstance(failed["not-a-uuid"], InvalidRequestError)
    for result in results:
        assert (result.job is None) == (not result.ok)


async def test_iter_extractions_pulls_ids_no_further_than_its_concurrency(serve: Serve) -> None:
    # fan_out's own bound, apart from AdaptiveConcurrency's: while every call is held, only
    # `concurrency` ids have been taken from a lazy source (the adaptive limit alone would let
    # an unbounded fan-out take ids it cannot send yet).
    release = asyncio.Event()
    held = 0
    all_held = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal held
        held += 1
        if held == 4:
            all_held.set()
        await release.wait()
        return web.json_response(job_body(request.path.rsplit("/", 1)[1]))

    server = await serve(handler)
    pulled = 0

    def source() -> Iterator[str]:
        nonlocal pulled
        for job_id in job_ids(10_000):
            pulled += 1
            yield job_id

    async with (
        AsyncSearchClient(API_KEY, base_url=server.base_url) as client,
        client.iter_extractions(source(), concurrency=4) as results,
    ):
        first = asyncio.create_task(anext(results))
        async with asyncio.timeout(10):
            await all_held.wait()
        for _ in range(20):
            await asyncio.sleep(0)  # room to pull more, if anything would
        assert pulled == 4
        assert server.max_in_flight == 4
        release.set()
        async with asyncio.timeout(10):
            assert (await first).ok
    assert server.max_in_flight == 4


async def test_ordered_iteration_keeps_input_order(serve: Serve) -> None:
    server = await serve(extract_handler(latency=0.002))
    ids = job_ids(50)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ordered = [r.job_id async for r in client.iter_extractions(ids, ordered=True)]
    assert ordered == ids


async def test_async_iterable_of_ids(serve: Serve) -> None:
    server = await serve(extract_handler())

    async def source() -> AsyncIterator[str]:
        for job_id in job_ids(30):
            yield job_id

    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        results = await client.gather_extractions(source())
    assert [r.job_id for r in results] == job_ids(30)


async def test_odd_timestamps_never_fail_a_job(serve: Serve) -> None:
    # ISO 8601 that is not RFC 3339, and text that is no date at all: every job still comes back.
    odd = ["2024-02-04", "20240204T170251Z", "2024-W05-7", "yesterday", ""]
    ids = job_ids(len(odd))
    stamps = dict(zip(ids, odd, strict=True))

    async def handler(request: web.Request) -> web.StreamResponse:
        job_id = request.path.rsplit("/", 1)[1]
        body = job_body(job_id)
        body["createdAt"] = stamps[job_id]
        return web.json_response(body)

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        results = await client.gather_extractions(ids)
    assert [r.error for r in results] == [None] * len(odd)
    created = [r.job.created_at for r in results if r.job is not None]
    # Without a UTC offset a value stays the text as sent: no naive datetime is ever made.
    assert created[:3] == [
        "2024-02-04",
        datetime.datetime(2024, 2, 4, 17, 2, 51, tzinfo=datetime.UTC),
        "2024-W05-7",
    ]
    assert created[3:] == ["yesterday", ""]


def _ids_as(kind: str, ids: list[str]) -> Iterable[str] | AsyncIterable[str]:
    """The same ids as a list, a tuple, a set, a dict's keys, a generator, an iterator or an
    async generator."""
    if kind == "async generator":

        async def agen() -> AsyncIterator[str]:
            for job_id in ids:
                yield job_id

        return agen()
    return {
        "list": lambda: list(ids),
        "tuple": lambda: tuple(ids),
        "set": lambda: set(ids),
        "dict keys": lambda: dict.fromkeys(ids).keys(),
        "generator": lambda: (job_id for job_id in ids),
        "iterator": lambda: iter(ids),
        "map": lambda: map(str, ids),
    }[kind]()


# Sized iterables report a total to on_progress; the others report None (the total is unknown).
ID_KINDS = {
    "list": True,
    "tuple": True,
    "set": True,
    "dict keys": True,
    "generator": False,
    "iterator": False,
    "map": False,
    "async generator": False,
}


@pytest.mark.parametrize("kind", list(ID_KINDS))
async def test_gather_takes_any_iterable_of_ids(serve: Serve, kind: str) -> None:
    server = await serve(extract_handler())
    ids = job_ids(25)
    progress: list[tuple[int, int | None]] = []
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        results = await client.gather_extractions(
            _ids_as(kind, ids), concurrency=4, on_progress=lambda d, t: progress.append((d, t))
        )
    got = [r.job_id for r in results]
    if kind == "set":
        assert sorted(got) == ids  # a set has no order of its own; input order is its order
    else:
        assert got == ids
    assert all(r.ok for r in results)
    assert len(server.seen) == 25
    total = 25 if ID_KINDS[kind] else None
    assert progress == [(done, total) for done in range(1, 26)]


@pytest.mark.parametrize("kind", list(ID_KINDS))
@pytest.mark.parametrize("ordered", [False, True])
async def test_iter_extractions_takes_any_iterable_of_ids(
    serve: Serve, kind: str, ordered: bool
) -> None:
    server = await serve(extract_handler())
    ids = job_ids(25)
    progress: list[tuple[int, int | None]] = []
    async with (
        AsyncSearchClient(API_KEY, base_url=server.base_url) as client,
        client.iter_extractions(
            _ids_as(kind, ids),
            concurrency=4,
            ordered=ordered,
            on_progress=lambda d, t: progress.append((d, t)),
        ) as results,
    ):
        got = [r async for r in results]
    assert sorted(str(r.job_id) for r in got) == ids
    assert all(r.ok for r in got)
    assert progress[-1] == (25, 25 if ID_KINDS[kind] else None)


SINGLE_VALUES: dict[str, object] = {
    "str": job_ids(1)[0],
    "empty str": "",
    "bytes": job_ids(1)[0].encode(),
    "bytearray": bytearray(job_ids(1)[0].encode()),
    "uuid.UUID": uuid.UUID(job_ids(1)[0]),
    "int": 7,
}


@pytest.mark.parametrize("case", list(SINGLE_VALUES))
async def test_a_single_id_is_refused_before_anything_is_sent(serve: Serve, case: str) -> None:
    server = await serve(extract_handler())
    value: Any = SINGLE_VALUES[case]
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(InvalidRequestError, match="job_ids must be an iterable"):
            await client.gather_extractions(value)
        with pytest.raises(InvalidRequestError, match="job_ids must be an iterable"):
            client.iter_extractions(value)
    assert server.seen == []


async def test_retry_budget_bounds_the_load_on_a_failing_service(
    serve: Serve, no_backoff: list[float]
) -> None:
    server = await serve(extract_handler(default=503))
    budget = RetryBudget()
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_retries=3, retry_budget=budget
    ) as client:
        results = await client.gather_extractions(job_ids(1000), concurrency=64)
    assert len(results) == 1000
    assert all(isinstance(r.error, InternalServerError) for r in results)
    # 500 tokens at 5 per retry: at most 100 retries on top of the 1000 first attempts,
    # where max_retries alone would have allowed 3000.
    assert 1000 < len(server.seen) <= 1100
    assert budget.tokens < 5
    assert sum(r.error.attempts or 0 for r in results if r.error) == len(server.seen)


async def test_retry_budget_is_shared_with_derived_clients(
    serve: Serve, no_backoff: list[float]
) -> None:
    server = await serve(extract_handler(default=503))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        child = client.with_options(max_retries=5)
        assert child._shared.retry_budget is client._shared.retry_budget
        await child.gather_extractions(job_ids(200))
        before = len(server.seen)
        with pytest.raises(InternalServerError) as info:
            await client.get_extraction(job_ids(1)[0])
    assert info.value.attempts == 1  # the budget the child drained is the parent's too
    assert len(server.seen) == before + 1


async def test_retry_budget_none_turns_it_off(serve: Serve, no_backoff: list[float]) -> None:
    server = await serve(extract_handler(default=503))
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_retries=2, retry_budget=None
    ) as client:
        await client.gather_extractions(job_ids(200), concurrency=32)
    assert len(server.seen) == 600


async def test_retry_after_pauses_the_whole_batch(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrivals: list[float] = []
    first = True
    # The other first calls are answered only once the client has taken in the 429 (it is
    # sleeping before its retry): no bet that a 429 outruns answers sent 20 ms later.
    throttled = asyncio.Event()
    real_sleep = _call._sleep

    async def backoff(delay: float) -> None:
        throttled.set()
        await real_sleep(delay)

    monkeypatch.setattr(_call, "_sleep", backoff)

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal first
        arrivals.append(time.monotonic())
        if first:
            first = False
            return web.json_response({}, status=429, headers={"Retry-After": "0.5"})
        await throttled.wait()
        return web.json_response(job_body(request.path.rsplit("/", 1)[1]))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        async with asyncio.timeout(20):
            results = await client.gather_extractions(job_ids(12), concurrency=4)
    assert all(r.ok for r in results)
    throttled_at = arrivals[0]
    later = arrivals[4:]  # at most four went out before the 429 was taken in
    assert later
    assert min(later) >= throttled_at + 0.4, "new calls started while the service said wait"


async def test_overload_shrinks_concurrency(serve: Serve, no_backoff: list[float]) -> None:
    in_flight = 0
    seen_in_flight: list[int] = []

    first_wave = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight
        in_flight += 1
        seen_in_flight.append(in_flight)
        if in_flight == 16:
            first_wave.set()
        try:
            if len(seen_in_flight) <= 16:
                await first_wave.wait()  # the first 16 are all in flight before any answer
            else:
                # Held a moment, so that calls the client lets overlap are seen to overlap
                # (a slow client can only make the bound look tighter, never fail it).
                await asyncio.sleep(0.005)
            return web.json_response({}, status=429)
        finally:
            in_flight -= 1

    server = await serve(handler)
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_retries=0, retry_budget=None
    ) as client:
        async with asyncio.timeout(20):
            results = await client.gather_extractions(job_ids(300), concurrency=16)
    assert all(isinstance(r.error, RateLimitError) for r in results)
    assert len(server.seen) == 300
    assert max(seen_in_flight[:16]) == 16
    # Every answer was a 429: the limit was cut again and again, down to a single call.
    assert max(seen_in_flight[-50:]) <= 2


async def test_a_bulk_call_never_times_out_waiting_for_its_own_pool(
    serve: Serve, no_backoff: list[float]
) -> None:
    # Two bulk calls of 10 in flight each share a pool of 2 connections, and every answer takes
    # 0.1 s: most requests wait for the pool far longer than Timeout.pool. That wait is the
    # calls' own queue, not a fault: nothing may end in PoolTimeoutError.
    server = await serve(extract_handler(latency=0.1))
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=2, timeout=Timeout(pool=0.05)
    ) as client:
        both = await asyncio.gather(
            client.gather_extractions(job_ids(10), concurrency=10),
            client.gather_extractions(job_ids(10)[::-1], concurrency=10),
        )
    assert [r.error for results in both for r in results] == [None] * 20
    assert server.max_in_flight <= 2
    assert len(server.seen) == 20


async def test_a_bulk_call_sharing_the_pool_with_direct_calls_never_times_out_on_it(
    serve: Serve, no_backoff: list[float]
) -> None:
    # A direct call and the bulk call's first request hold the two connections until the test
    # says so: the bulk call's other requests wait for one far past Timeout.pool, without a
    # time limit, while a direct call still gets its PoolTimeoutError. The bulk call's gate
    # gives every connection back.
    direct_id = job_ids(11)[10]
    direct_in = asyncio.Event()
    bulk_in = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        job_id = request.path.rsplit("/", 1)[1]
        (direct_in if job_id == direct_id else bulk_in).set()
        await release.wait()
        return web.json_response(job_body(job_id))

    server = await serve(handler)
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=2, timeout=Timeout(pool=0.05)
    ) as client:
        direct = asyncio.create_task(client.get_extraction(direct_id))
        await direct_in.wait()
        bulk = asyncio.create_task(client.gather_extractions(job_ids(10), concurrency=10))
        await bulk_in.wait()
        with pytest.raises(PoolTimeoutError):
            await client.get_extraction(direct_id)
        release.set()
        results = await bulk
        assert (await direct).id == direct_id
        # Both connections are free again: two direct calls at once need no wait.
        await asyncio.gather(*(client.get_extraction(i) for i in job_ids(2)))
    assert [r.error for r in results] == [None] * 10
    assert server.max_in_flight <= 2


async def test_a_bulk_request_waiting_to_retry_leaves_its_connection_to_others(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool of one connection; the bulk call's request gets a 503 and waits to retry until the
    # test opens the gate. Meanwhile its connection is back in the pool: a direct call gets it
    # at once (Timeout.pool is 0.05 s: it would fail were the connection held through the
    # wait), and the bulk call takes it again, without a time limit, for its retry.
    waiting, gate = hold_backoff(monkeypatch)
    bulk_id, direct_id = job_ids(2)
    server = await serve(extract_handler(script={bulk_id: [503]}))
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=1, timeout=Timeout(pool=0.05)
    ) as client:
        bulk = asyncio.create_task(client.gather_extractions([bulk_id]))
        async with asyncio.timeout(30):
            await waiting.wait()
        assert (await client.get_extraction(direct_id)).id == direct_id
        gate.set()
        async with asyncio.timeout(30):
            [result] = await bulk
        assert result.ok
        assert result.job_id == bulk_id
        # The connection is back in the pool once: one direct call needs no wait, and a bulk
        # call still has its one connection to use.
        await client.get_extraction(direct_id)
        assert [r.ok for r in await client.gather_extractions(job_ids(3))] == [True] * 3
    sent = [seen.path.rsplit("/", 1)[1] for seen in server.seen]
    assert sent[:4] == [bulk_id, direct_id, bulk_id, direct_id]
    assert sorted(sent[4:]) == sorted(job_ids(3))


async def test_a_bulk_call_keeps_no_more_in_flight_than_a_callers_session_pool(
    serve: Serve, no_backoff: list[float]
) -> None:
    # aiohttp counts waiting for its own pool against `total`: a bulk call must not queue there.
    queued = 0

    async def on_queued(*args: object) -> None:
        nonlocal queued
        queued += 1

    tracing = aiohttp.TraceConfig()
    tracing.on_connection_queued_start.append(on_queued)
    server = await serve(extract_handler(latency=0.05))
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2), trace_configs=[tracing]
        ) as session,
        AsyncSearchClient(API_KEY, base_url=server.base_url, session=session) as client,
    ):
        results = await client.gather_extractions(job_ids(8), concurrency=8)
    assert [r.error for r in results] == [None] * 8
    assert queued == 0  # never more requests at once than the connector's limit
    assert server.max_in_flight <= 2
    assert len(server.seen) == 8


@pytest.mark.parametrize("method", ["gather", "iter"])
@pytest.mark.parametrize(
    ("status", "error"), [(401, AuthenticationError), (403, PermissionDeniedError)]
)
async def test_a_refused_key_stops_a_bulk_call(
    serve: Serve, method: str, status: int, error: type[APIStatusError]
) -> None:
    server = await serve(extract_handler(default=status))
    ids = job_ids(50)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        if method == "gather":
            results = await client.gather_extractions(ids, concurrency=4)
        else:
            async with client.iter_extractions(ids, concurrency=4, ordered=True) as iterated:
                results = [result async for result in iterated]
    assert [r.job_id for r in results] == ids
    sent = [seen.path.rsplit("/", 1)[1] for seen in server.seen]
    assert 1 <= len(sent) <= 4  # only the requests already in flight when the first came back
    assert len(set(sent)) == len(sent)  # one per id at most
    for result in results:
        assert type(result.error) is error, result
        assert result.error.status_code == status
        if result.job_id in sent:
            assert "not sent" not in str(result.error)
        else:
            assert str(result.error).startswith("not sent")
            assert isinstance(result.error.__cause__, error)
            assert API_KEY not in repr(result.error)


async def test_a_retry_after_past_max_retry_after_fails_its_id_at_once_and_pauses_nobody(
    serve: Serve, no_backoff: list[float]
) -> None:
    ids = job_ids(6)
    server = await serve(
        extract_handler(script={ids[0]: [503]}, headers={503: {"Retry-After": "3600"}})
    )
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_retry_after=1) as client:
        # One call at a time: every later id starts after the 503, so a pause of an hour (the
        # Retry-After not honoured) would hold them all, and the deadline would fail the test.
        async with asyncio.timeout(10 * TIME_SCALE):
            results = await client.gather_extractions(ids, concurrency=1)
    assert isinstance(results[0].error, InternalServerError)
    assert results[0].error.attempts == 1  # failed at once: not retried, not slept on
    assert [r.ok for r in results[1:]] == [True] * 5
    assert no_backoff == []
    assert len(server.seen) == 6


@pytest.mark.parametrize(
    "how", ["break", "aclose", "async with", "exception", "cancel-gather", "cancel-iter"]
)
async def test_leaving_a_bulk_fetch_early_cleans_up(serve: Serve, how: str) -> None:
    server = await serve(extract_handler(latency=0.05))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ids = job_ids(5000)
        if how == "break":
            async for _ in client.iter_extractions(ids, concurrency=8):
                break
        elif how == "aclose":
            results = client.iter_extractions(ids, concurrency=8)
            await results.__anext__()
            await results.aclose()
        elif how == "async with":
            async with client.iter_extractions(ids, concurrency=8) as results:
                await results.__anext__()
        elif how == "exception":
            with pytest.raises(LookupError):  # noqa: PT012 - raised from the loop body
                async for _ in client.iter_extractions(ids, concurrency=8):
                    raise LookupError
        else:
            if how == "cancel-gather":
                task = asyncio.create_task(client.gather_extractions(ids, concurrency=8))
            else:

                async def consume() -> None:
                    async with client.iter_extractions(ids, concurrency=8) as results:
                        async for _ in results:
                            pass

                task = asyncio.create_task(consume())
            await asyncio.sleep(0.12)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(5):
            await asyncio.sleep(0)
        assert client_tasks() == []
        seen = len(server.seen)
        assert seen < 100
        await asyncio.sleep(0.15)
        assert len(server.seen) == seen, "requests went on after the caller left"
        assert held_connections(client) == 0


async def test_cancelling_during_a_backoff_sleep(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeping = 0
    all_sleeping = asyncio.Event()

    async def backoff(delay: float) -> None:
        nonlocal sleeping
        sleeping += 1
        if sleeping == 4:
            all_sleeping.set()
        await asyncio.Event().wait()  # a backoff that lasts until the cancellation

    monkeypatch.setattr(_call, "_sleep", backoff)
    server = await serve(extract_handler(default=503))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=5) as client:
        task = asyncio.create_task(client.gather_extractions(job_ids(4), concurrency=4))
        async with asyncio.timeout(10):
            await all_sleeping.wait()  # every call is now sleeping before its retry
        assert len(server.seen) == 4
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(5):
            await asyncio.sleep(0)
        assert client_tasks() == []
        assert held_connections(client) == 0


def test_bulk_arguments_are_checked_at_once() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")
    with pytest.raises(InvalidRequestError, match="format"):
        client.iter_extractions(job_ids(3), format="pdf")
    with pytest.raises(InvalidRequestError, match="concurrency"):
        client.iter_extractions(job_ids(3), concurrency=0)


# -- a closed client ends its bulk calls --------------------------------------------------------


async def endless_ids(closed: list[bool]) -> AsyncIterator[str]:
    """Ids without end; ``closed`` says whether the fan-out closed the source."""
    n = 0
    try:
        while True:
            n += 1
            yield str(uuid.UUID(int=n, version=4))
    finally:
        closed.append(True)


def gated_handler(entered: asyncio.Event, gate: asyncio.Event, seen: list[str]) -> Handler:
    """Answers jobs, but holds every request from the 12th on behind ``gate``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        job_id = request.path.rsplit("/", 1)[1]
        seen.append(job_id)
        if len(seen) >= 12:
            entered.set()
            await gate.wait()
        return web.json_response(job_body(job_id))

    return handler


async def test_closing_the_client_ends_iter_extractions_over_an_endless_source(
    serve: Serve,
) -> None:
    # Issue 27: closing the client during iter_extractions over 200k ids gave 199,984
    # ClientClosedError results over 11 s; over an endless id source it never ended.
    entered, gate, seen = asyncio.Event(), asyncio.Event(), []
    server = await serve(gated_handler(entered, gate, seen))
    closed: list[bool] = []
    client = AsyncSearchClient(API_KEY, base_url=server.base_url)
    taken: list[ExtractionResult[str]] = []
    try:
        async with asyncio.timeout(10 * TIME_SCALE):
            results = client.iter_extractions(endless_ids(closed), concurrency=4)
            async for result in results:
                taken.append(result)
                if len(taken) == 10:
                    await entered.wait()  # requests are in flight, held by the server
                    await client.aclose()
    except _client.ClientClosedError:
        pass
    else:
        raise AssertionError("the iteration ended without ClientClosedError")
    finally:
        gate.set()
        await client.aclose()
    # The results before the close, and none of the ids after it as an error each.
    assert all(isinstance(r, ExtractionSuccess) for r in taken)
    assert len(taken) < 12
    assert closed == [True]  # the source was closed, not read on
    # At most what the fan-out holds started beyond what was taken (2 x concurrency).
    assert len(seen) <= 10 + 8
    assert client_tasks() == []


async def close_when_held(
    serve: Serve, bulk_call: Callable[[AsyncSearchClient], Awaitable[object]]
) -> list[str]:
    """Run ``bulk_call`` and close its client once the server holds requests; the ids seen.

    ``bulk_call`` gets the client whose pool is closed and must raise ``ClientClosedError``.
    """
    entered, gate, seen = asyncio.Event(), asyncio.Event(), []
    server = await serve(gated_handler(entered, gate, seen))
    client = AsyncSearchClient(API_KEY, base_url=server.base_url)

    async def close() -> None:
        await entered.wait()
        await client.aclose()

    try:
        async with asyncio.timeout(10 * TIME_SCALE), asyncio.TaskGroup() as tasks:
            tasks.create_task(close())
            with pytest.raises(_client.ClientClosedError, match="closed"):
                await bulk_call(client)
    finally:
        gate.set()
        await client.aclose()
    assert client_tasks() == []
    return seen


async def test_closing_the_client_ends_gather_extractions(serve: Serve) -> None:
    seen = await close_when_held(
        serve, lambda client: client.gather_extractions(job_ids(100_000), concurrency=8)
    )
    assert len(seen) <= 12 + 8  # the held requests, one per slot of concurrency at most


async def test_a_with_options_client_closed_with_its_pool_ends_the_bulk_call(
    serve: Serve,
) -> None:
    # A copy made by with_options shares the pool: closing the parent ends the copy's call too.
    closed: list[bool] = []

    async def iterate(client: AsyncSearchClient) -> None:
        child = client.with_options(max_retries=0)
        async for _ in child.iter_extractions(endless_ids(closed), concurrency=4):
            pass

    await close_when_held(serve, iterate)
    assert closed == [True]


# -- wait_for_extraction ----------------------------------------------------------------------


async def test_wait_for_extraction_polls_until_done(serve: Serve, no_backoff: list[float]) -> None:
    states = ["pending", "pending", "done"]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], states.pop(0)))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        job = await client.wait_for_extraction(job_ids(1)[0], interval=2.0)
    assert job.state == "done"
    assert len(server.seen) == 3
    # The interval grows by 1.5x with +-20% jitter.
    assert 1.6 <= no_backoff[0] <= 2.4
    assert 2.4 <= no_backoff[1] <= 3.6


@pytest.mark.parametrize("final", ["processing", "completed", "error", "done", "failed"])
async def test_wait_for_extraction_returns_at_the_first_poll_past_pending(
    serve: Serve, no_backoff: list[float], final: str
) -> None:
    # The spec names no final state and one in-progress state, pending: whatever a job becomes
    # after it ends the wait, at the first poll that sees it (issue 27: the default wait must not
    # depend on "processing", a value only the emulator uses).
    states = ["pending", "pending", final, "never asked for"]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], states.pop(0)))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        job = await client.wait_for_extraction(job_ids(1)[0])
    assert job.state == final
    assert len(server.seen) == 3
    assert frozenset({"pending"}) == IN_PROGRESS_JOB_STATES


async def test_wait_for_extraction_in_progress_names_the_states_to_wait_through(
    serve: Serve, no_backoff: list[float]
) -> None:
    states = ["pending", "processing", "queued", "done", "never asked for"]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], states.pop(0)))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        job = await client.wait_for_extraction(
            job_ids(1)[0], in_progress={"pending", "processing", "queued"}
        )
        assert job.state == "done"
        assert len(server.seen) == 4
        for bad in ("pending", [], [None]):
            with pytest.raises(InvalidRequestError, match="in_progress"):
                await client.wait_for_extraction(job_ids(1)[0], in_progress=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="not both"):
            await client.wait_for_extraction(job_ids(1)[0], in_progress={"pending"}, until={"done"})
    assert len(server.seen) == 4  # bad arguments send nothing


async def test_wait_for_extraction_logs_a_state_it_does_not_know_once(
    serve: Serve, no_backoff: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    unknown = f"state-{uuid.uuid4()}"  # seen by no other test, whatever their order
    missing = job_body(job_ids(1)[0], "pending")
    del missing["state"]
    answers: list[dict[str, object]] = [job_body(job_ids(1)[0], unknown)] * 2 + [missing]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(answers.pop(0))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        for _ in range(2):
            assert (await client.wait_for_extraction(job_ids(1)[0])).state == unknown
        assert (await client.wait_for_extraction(job_ids(1)[0])).state is None  # no state: done
    lines = [r for r in caplog.records if r.levelno == logging.INFO and unknown in r.getMessage()]
    assert len(lines) == 1
    assert "wait_for_extraction" in lines[0].getMessage()


async def test_wait_for_extraction_until_other_states(
    serve: Serve, no_backoff: list[float]
) -> None:
    states = ["pending", "processing", "done"]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], states.pop(0)))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        job = await client.wait_for_extraction(job_ids(1)[0], until={"processing", "done"})
        assert job.state == "processing"
        assert len(server.seen) == 2
        for bad in ("done", [], [3]):
            with pytest.raises(InvalidRequestError, match="until"):
                await client.wait_for_extraction(job_ids(1)[0], until=bad)  # type: ignore[arg-type]
    assert len(server.seen) == 2  # bad arguments send nothing


async def test_wait_for_extraction_custom_condition(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], "pending"))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        job = await client.wait_for_extraction(job_ids(1)[0], until=lambda j: j.state == "pending")
    assert job.state == "pending"
    assert len(server.seen) == 1


async def test_wait_for_extraction_times_out_with_the_last_job(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(job_body(request.path.rsplit("/", 1)[1], "pending"))

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        started = time.monotonic()
        with pytest.raises(WaitTimeoutError) as info:
            await client.wait_for_extraction(job_ids(1)[0], interval=0.05, max_wait=0.3)
        assert time.monotonic() - started < 1.0 * TIME_SCALE  # a liveness bound, scaled
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value.job, ExtractionJob)
    assert info.value.job.state == "pending"
    assert info.value.attempts == len(server.seen)
    assert len(server.seen) >= 2


async def test_wait_deadline_covers_a_hanging_request(serve: Serve) -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({})

    server = await serve(handler)
    try:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            with pytest.raises(WaitTimeoutError) as info:
                await client.wait_for_extraction(job_ids(1)[0], max_wait=0.2)
    finally:
        release.set()
    assert info.value.job is None


async def test_wait_for_extraction_raises_not_found_at_once(serve: Serve) -> None:
    server = await serve(extract_handler(default=404))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(NotFoundError):
            await client.wait_for_extraction(job_ids(1)[0])
    assert len(server.seen) == 1


async def test_a_bulk_worker_waiting_for_its_next_id_holds_no_connection(serve: Serve) -> None:
    # Issue 37: over a slow async id source, the bulk call's workers held the pool's
    # connections while they waited for ids, so a direct call got PoolTimeoutError with one
    # request in flight on a pool of two.
    ids = job_ids(3)
    waiting_for_more = asyncio.Event()
    more = asyncio.Event()

    async def slow_source() -> AsyncIterator[str]:
        yield ids[0]
        waiting_for_more.set()
        await more.wait()
        yield ids[1]
        yield ids[2]

    answer = extract_handler()
    first_answered = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith(ids[0]):
            await first_answered.wait()  # the first id's request keeps its connection
        return await answer(request)

    server = await serve(handler)
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=2, timeout=Timeout(pool=0.05)
    ) as client:
        bulk = asyncio.create_task(client.gather_extractions(slow_source(), concurrency=4))
        try:
            async with asyncio.timeout(10 * TIME_SCALE):
                await waiting_for_more.wait()  # one worker waits in the source for an id
                job = await client.get_extraction(ids[2])  # the other connection is free
                assert str(job.id) == ids[2]
        finally:
            first_answered.set()
            more.set()
        async with asyncio.timeout(10 * TIME_SCALE):
            results = await bulk
    assert [r.job_id for r in results] == ids
    assert all(r.ok for r in results)


async def test_an_id_source_that_calls_the_client_does_not_wait_for_the_bulk_call(
    serve: Serve,
) -> None:
    # The id source checks each job with a direct call of the same client: with the bulk
    # workers holding both connections of the pool while they waited for it, it waited for
    # them until Timeout.pool (180 s by default) and the bulk call failed.
    ids = job_ids(6)
    server = await serve(extract_handler())
    first_done = asyncio.Event()
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=2, timeout=Timeout(pool=2 * TIME_SCALE)
    ) as client:

        async def checked_ids() -> AsyncIterator[str]:
            yield ids[0]
            # By now the worker that fetched the first id is back at the bulk call's gate,
            # waiting for this source (the other worker is in it).
            await first_done.wait()
            for job_id in ids[1:]:
                job = await client.get_extraction(job_id)
                yield str(job.id)

        async with asyncio.timeout(20 * TIME_SCALE):
            results = await client.gather_extractions(
                checked_ids(), concurrency=2, on_progress=lambda done, total: first_done.set()
            )
    assert [r.job_id for r in results] == ids
    assert all(r.ok for r in results)
    assert len(server.seen) == 11


async def test_a_bulk_call_s_deadline_holds_while_its_retry_waits_for_a_connection(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 37: deadline=0.3 returned after 2.03 s: the bulk request took its connection back
    # after its backoff outside the deadline's reach. Now the retry waits for a connection
    # inside its attempt, which the deadline bounds.
    waiting, gate = hold_backoff(monkeypatch)
    bulk_id, direct_id = job_ids(2)
    direct_in = asyncio.Event()
    hold = asyncio.Event()
    scripted = extract_handler(script={bulk_id: [503]})

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith(direct_id):
            direct_in.set()
            await hold.wait()  # the direct call keeps the pool's one connection
        return await scripted(request)

    server = await serve(handler)
    deadline = 0.5 * TIME_SCALE
    loop = asyncio.get_running_loop()
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_connections=1) as client:
        started = loop.time()
        bulk = asyncio.create_task(client.gather_extractions([bulk_id], deadline=deadline))
        direct = None
        try:
            async with asyncio.timeout(10 * TIME_SCALE):
                await waiting.wait()  # the 503 came: the bulk request waits to retry
                direct = asyncio.create_task(client.get_extraction(direct_id))
                await direct_in.wait()
                gate.set()  # the retry now needs the connection the direct call holds
                [result] = await bulk
            ended = loop.time()
        finally:
            hold.set()
        assert direct is not None
        await direct
    # The retry never went out: the call ends with its real error, the 503 (issue 45), saying
    # that the deadline stopped the retry, and counts the one attempt the server saw.
    assert isinstance(result.error, InternalServerError)
    assert result.error.status_code == 503
    assert result.error.attempts == 1
    assert result.error.retries_stopped is not None
    assert "deadline" in result.error.retries_stopped
    assert "connection of the pool" in result.error.retries_stopped
    assert ended - started <= deadline + 0.05 * TIME_SCALE
    assert [seen.path.rsplit("/", 1)[1] for seen in server.seen] == [bulk_id, direct_id]
