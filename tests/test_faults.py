"""The fault matrix: every way a server can fail, over real loopback sockets, with exact outcomes.

Each case checks the error type, how many connections and requests the server saw, that the call
ends within a bound (``asyncio.timeout``), that the client holds no connection afterwards, and
that the server sees every connection closed once the client is closed. The servers are
``RawServer`` scripts writing raw bytes (see ``faults_helpers``) or the bundled emulator.
"""

from __future__ import annotations

import asyncio
import email.utils
import gc
import gzip
import json
import logging
import time
import tracemalloc
import uuid
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchClient,
    AsyncSearchError,
    ClientClosedError,
    ExtractionJob,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ResponseTooLargeError,
    ResponseValidationError,
    RetryBudget,
    SearchPage,
    Timeout,
    _call,
)
from asyncsearch._transport import _translate
from asyncsearch.testing import ServiceEmulator

from .conftest import API_KEY, JOB_ID
from .faults_helpers import (
    Conn,
    RawRequest,
    RawServer,
    Respond,
    full_backlog,
    gzip_bomb,
    http_response,
    loop_complaints,
    pause,
    raw_server,
    stall,
)
from .helpers import TIME_SCALE, client_tasks, held_connections, hold_backoff

pytestmark = pytest.mark.timeout(30)

JOB = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()
BOUND = 10.0 * TIME_SCALE  # no case may take longer than this
Call = Callable[[AsyncSearchClient], Awaitable[object]]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff and Retry-After sleeps are recorded and skipped."""
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", record)
    return delays


def make_client(server: RawServer | str, **options: Any) -> AsyncSearchClient:
    base_url = server if isinstance(server, str) else server.base_url
    return AsyncSearchClient(API_KEY, base_url=base_url, **options)


def full_jitter_at_its_ceiling(client: AsyncSearchClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the backoff deterministic: every jittered delay is its ceiling (0.5 s, 1 s, ...)."""
    monkeypatch.setattr(client._shared.random, "random", lambda: 1.0)


async def outcome(server: RawServer, call: Call, **options: Any) -> Any:
    """Run ``call`` on a fresh client (bounded in time), close it, and check nothing is left.

    Returns what the call returned, or the exception it raised.
    """
    client = make_client(server, **options)
    result: Any
    try:
        try:
            async with asyncio.timeout(BOUND):
                result = await call(client)
        except (AsyncSearchError, aiohttp.ClientError, ValueError) as exc:
            # Only asyncsearch errors are expected; anything else makes the case fail below.
            result = exc
        assert held_connections(client) == 0
        assert client_tasks() == []
    finally:
        await client.aclose()
    await server.wait_all_closed()
    return result


def get_job(client: AsyncSearchClient) -> Awaitable[ExtractionJob]:
    return client.get_extraction(JOB_ID)


def answer(raw: bytes, *, keep_alive: bool = True) -> Respond:
    async def respond(request: RawRequest, conn: Conn) -> bool:
        conn.writer.write(raw)
        await conn.writer.drain()
        return keep_alive

    return respond


def statuses(*codes: int, headers: dict[str, str] | None = None) -> Respond:
    """Answer the n-th request with the n-th status (the last one repeats); 200 is a job."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        code = codes[min(request.index, len(codes) - 1)]
        if code == 200:
            conn.writer.write(http_response(200, JOB))
        else:
            body = json.dumps({"error": {"message": f"status {code}"}}).encode()
            conn.writer.write(http_response(code, body, headers=headers))
        await conn.writer.drain()
        return True

    return respond


async def close_at_once(request: RawRequest, conn: Conn) -> bool:
    return False


def drip(gap: float, pieces: int) -> Respond:
    """A chunked 200 whose body comes one byte every ``gap`` seconds."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        conn.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
        )
        for _ in range(pieces):
            if not await pause(conn, gap):
                return False
            conn.writer.write(b"1\r\n \r\n")
        conn.writer.write(b"1\r\n}\r\n0\r\n\r\n")
        return False

    return respond


# -- transport faults: a broken connection or framing, a silent or slow server ---------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

TRANSPORT_FAULTS: dict[str, tuple[Respond, dict[str, Any], type[APIConnectionError], str, int]] = {
    # name: (script, client options, error, words in the message, attempts == connections)
    "closed before the status line": (
        close_at_once,
        {},
        APIConnectionError,
        "closed the connection without answering",
        3,
    ),
    "Content-Length longer than the body": (
        answer(http_response(200, JOB, headers={"Content-Length": "999999"}), keep_alive=False),
        {},
        APIConnectionError,
        "cut or malformed",
        3,
    ),
    "cut mid-chunk": (
        answer(CHUNKED + b"100\r\n" + JOB[:50], keep_alive=False),
        {},
        APIConnectionError,
        "cut or malformed",
        3,
    ),
    "malformed chunk size": (
        answer(CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n", keep_alive=False),
        {},
        APIConnectionError,
        "malformed response",
        3,
    ),
    "chunk longer than its size": (
        answer(CHUNKED + b"2\r\n{}XX\r\n0\r\n\r\n", keep_alive=False),
        {},
        APIConnectionError,
        "malformed response",
        3,
    ),
    "not HTTP at all": (
        answer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", keep_alive=False),
        {},
        APIConnectionError,
        "malformed response",
        3,
    ),
    "stall before the headers past the read timeout": (
        stall,
        {"timeout": Timeout(read=0.2), "max_retries": 1},
        APITimeoutError,
        "timed out waiting for data",
        2,
    ),
    "slow drip: every gap under the read timeout, the whole past the total": (
        drip(0.1, 40),
        {"timeout": Timeout(read=0.4, total=0.6), "max_retries": 1},
        APITimeoutError,
        "total timeout",
        2,
    ),
    "slow drip: a gap past the read timeout": (
        drip(0.6, 3),
        {"timeout": Timeout(read=0.2, total=5), "max_retries": 1},
        APITimeoutError,
        "timed out waiting for data",
        2,
    ),
    "a server that never answers, under a short total timeout": (
        stall,
        {"timeout": 0.3, "max_retries": 0},
        APITimeoutError,
        "total timeout",
        1,
    ),
}


@pytest.mark.parametrize("case", list(TRANSPORT_FAULTS))
async def test_transport_fault(case: str, sleeps: list[float]) -> None:
    script, options, error, words, attempts = TRANSPORT_FAULTS[case]
    async with raw_server(script) as server:
        started = time.monotonic()
        result = await outcome(server, get_job, **options)
        took = time.monotonic() - started
    assert type(result) is error, repr(result)
    assert words in str(result)
    assert result.attempts == attempts
    assert server.connections == attempts
    assert server.requests == attempts
    assert len(sleeps) == attempts - 1
    if isinstance(result, APITimeoutError):
        # Each attempt ended at its own limit, not at the test's bound.
        assert took < (attempts * 1.0 + 1.0) * TIME_SCALE
    assert API_KEY not in repr(result) + repr(result.__cause__)


async def test_connection_refused_is_retried_and_leaves_nothing(sleeps: list[float]) -> None:
    import socket

    with socket.socket() as holder:
        # Bound but not listening: connecting is refused, and no other process can take the port.
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        client = make_client(f"http://127.0.0.1:{port}", max_retries=2)
        async with asyncio.timeout(BOUND):
            with pytest.raises(APIConnectionError, match="connection failed") as info:
                await get_job(client)
        assert held_connections(client) == 0
        await client.aclose()
    assert type(info.value) is APIConnectionError
    assert info.value.attempts == 3
    assert len(sleeps) == 2


def connect_hangs(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
        except TimeoutError:
            return True
        except OSError:
            return False
    return False


async def test_connect_timeout_on_a_full_accept_queue(sleeps: list[float]) -> None:
    with full_backlog() as port:
        if not connect_hangs(port):
            pytest.skip("this kernel refuses connections past the backlog instead of dropping")
        client = make_client(
            f"http://127.0.0.1:{port}", timeout=Timeout(connect=0.3), max_retries=1
        )
        started = time.monotonic()
        async with asyncio.timeout(BOUND):
            with pytest.raises(APITimeoutError, match="timed out connecting") as info:
                await get_job(client)
        assert time.monotonic() - started < 2.0 * TIME_SCALE
        assert held_connections(client) == 0
        await client.aclose()
    assert info.value.attempts == 2
    assert len(sleeps) == 1


async def test_total_covers_opening_the_connection(sleeps: list[float]) -> None:
    """``total`` bounds the attempt from the moment it has a pool slot: connecting included."""
    with full_backlog() as port:
        if not connect_hangs(port):
            pytest.skip("this kernel refuses connections past the backlog instead of dropping")
        client = make_client(
            f"http://127.0.0.1:{port}", timeout=Timeout(connect=30.0, total=0.3), max_retries=0
        )
        started = time.monotonic()
        async with asyncio.timeout(BOUND):
            with pytest.raises(APITimeoutError, match="total timeout"):
                await get_job(client)
        assert time.monotonic() - started < 2.0 * TIME_SCALE
        assert held_connections(client) == 0
        await client.aclose()


def test_aiohttp_connect_timeout_maps_to_a_timeout_error() -> None:
    # The mapping itself, independent of how a kernel treats a full accept queue.
    error = _translate(aiohttp.ConnectionTimeoutError("Connection timeout to host"))
    assert type(error) is APITimeoutError
    assert error.retryable
    assert "connecting" in str(error)


def test_the_default_timeout_bounds_every_phase() -> None:
    client = AsyncSearchClient(API_KEY, base_url="https://api.example.com")
    timeout = client._options.timeout
    assert timeout == Timeout(connect=10.0, read=60.0, total=180.0, pool=180.0)
    for value in (timeout.connect, timeout.read, timeout.total, timeout.pool):
        assert value is not None
        assert 0 < value < float("inf")


# -- Retry-After ---------------------------------------------------------------------------------


def http_date(offset: float) -> str:
    return email.utils.formatdate(time.time() + offset, usegmt=True)


RETRY_AFTER_SLEPT: dict[str, tuple[Callable[[], str], float, float]] = {
    # name: (header value, lowest and highest delay slept before the second attempt)
    "seconds": (lambda: "3", 3.0, 3.0),
    "fractional seconds": (lambda: "1.25", 1.25, 1.25),
    "an HTTP date 30 s ahead": (lambda: http_date(30), 28.0, 30.0),
    "zero": (lambda: "0", 0.0, 0.0),
    # Values that make no sense fall back to the backoff, pinned here at its 0.5 s ceiling.
    "an HTTP date in the past": (lambda: http_date(-3600), 0.5, 0.5),
    "negative": (lambda: "-5", 0.5, 0.5),
    "signed": (lambda: "+3", 0.5, 0.5),
    # Sent as UTF-8 bytes (the helper writes latin-1); float() would read them as 3.
    "an Arabic-Indic digit": (lambda: "\u0663".encode().decode("latin-1"), 0.5, 0.5),
    "fullwidth digits": (lambda: "\uff13".encode().decode("latin-1"), 0.5, 0.5),
    "inf": (lambda: "inf", 0.5, 0.5),
    "nan": (lambda: "nan", 0.5, 0.5),
    "garbage": (lambda: "soon, please", 0.5, 0.5),
    "an exponent": (lambda: "1e3", 0.5, 0.5),
    "digits past the largest float": (lambda: "9" * 400, 0.5, 0.5),
    "empty": (lambda: "", 0.5, 0.5),
}


@pytest.mark.parametrize("case", list(RETRY_AFTER_SLEPT))
async def test_retry_after_sets_the_delay(
    case: str, sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    value, low, high = RETRY_AFTER_SLEPT[case]
    async with raw_server(statuses(429, 200, headers={"Retry-After": value()})) as server:
        client = make_client(server)
        full_jitter_at_its_ceiling(client, monkeypatch)
        async with asyncio.timeout(BOUND):
            job = await get_job(client)
        await client.aclose()
        await server.wait_all_closed()
    assert job.id == JOB_ID
    assert server.requests == 2
    assert len(sleeps) == 1
    assert low <= sleeps[0] <= high


RETRY_AFTER_TOO_LONG: dict[str, tuple[int, Callable[[], str], float, float]] = {
    "429, seconds": (429, lambda: "3600", 3600.0, 3600.0),
    "429, huge": (429, lambda: "99999999999999999999", 1e20, 1e20),
    "429, an HTTP date two hours ahead": (429, lambda: http_date(7200), 7190.0, 7200.0),
    "503, seconds": (503, lambda: "61", 61.0, 61.0),
}


@pytest.mark.parametrize("case", list(RETRY_AFTER_TOO_LONG))
async def test_retry_after_above_max_retry_after_is_raised_at_once(
    case: str, sleeps: list[float]
) -> None:
    status, value, low, high = RETRY_AFTER_TOO_LONG[case]
    async with raw_server(statuses(status, headers={"Retry-After": value()})) as server:
        result = await outcome(server, get_job, max_retry_after=60)
    assert isinstance(result, APIStatusError)
    assert result.status_code == status
    assert result.attempts == 1
    assert server.requests == 1
    assert sleeps == []
    if status == 429:
        assert isinstance(result, RateLimitError)
        assert result.retry_after is not None
        assert low <= result.retry_after <= high
    else:
        assert isinstance(result, InternalServerError)


# -- statuses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
async def test_retryable_status_then_success_reuses_the_connection(
    status: int, sleeps: list[float]
) -> None:
    async with raw_server(statuses(status, 200)) as server:
        result = await outcome(server, get_job)
    assert isinstance(result, ExtractionJob)
    assert server.requests == 2
    # One connection for both: the error body was read to the end before the retry.
    assert server.connections == 1
    assert len(sleeps) == 1


async def test_persistent_503_is_raised_with_its_attempts(sleeps: list[float]) -> None:
    async with raw_server(statuses(503)) as server:
        result = await outcome(server, get_job, max_retries=4)
    assert type(result) is InternalServerError
    assert result.attempts == 5
    assert "after 5 attempts" in str(result)
    assert server.requests == 5
    assert server.connections == 1
    assert len(sleeps) == 4


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 405, 410, 418])
async def test_final_status_is_sent_exactly_once(status: int, sleeps: list[float]) -> None:
    async with raw_server(statuses(status)) as server:
        result = await outcome(server, get_job, max_retries=5)
    assert isinstance(result, APIStatusError)
    assert result.status_code == status
    assert result.attempts == 1
    assert server.requests == 1
    assert sleeps == []


async def test_a_dead_service_costs_at_most_the_retry_budget(sleeps: list[float]) -> None:
    ids = [str(uuid.UUID(int=i + 1, version=4)) for i in range(1000)]
    async with ServiceEmulator(api_key=API_KEY) as emu:
        emu.faults.set("extract", rate_503=1.0)
        budget = RetryBudget()
        async with make_client(emu.base_url, max_retries=3, retry_budget=budget) as client:
            async with asyncio.timeout(20 * TIME_SCALE):
                results = await client.gather_extractions(ids, concurrency=50)
        requests = emu.stats.count("extract")
    assert len(results) == 1000
    assert all(isinstance(r.error, InternalServerError) for r in results)
    # 500 tokens at 5 a retry: at most 100 retries, where max_retries alone allows 3000.
    assert 1000 < requests <= 1100
    assert sum(r.error.attempts or 0 for r in results if r.error is not None) == requests


async def test_an_error_after_the_budget_ran_out_says_so(sleeps: list[float]) -> None:
    # Issue 27: with max_retries=4 the error said "(after 2 attempts)" and nothing of the budget.
    budget = RetryBudget(capacity=5)  # one retry's worth
    async with raw_server(statuses(503)) as server:
        result = await outcome(server, get_job, max_retries=4, retry_budget=budget)
    assert isinstance(result, InternalServerError)
    assert result.attempts == 2
    assert server.requests == 2
    assert result.retries_stopped is not None
    assert "retry budget is spent (1 of max_retries=4 retries made" in result.retries_stopped
    assert str(result).endswith(
        "(after 2 attempts; not retried: the client's retry budget is spent "
        "(1 of max_retries=4 retries made; see RetryBudget))"
    )
    # max_retries itself ending the retries is not the budget's doing.
    async with raw_server(statuses(503)) as server:
        result = await outcome(server, get_job, max_retries=1)
    assert result.attempts == 2
    assert result.retries_stopped is None
    assert str(result).endswith("(after 2 attempts)")


# -- bodies --------------------------------------------------------------------------------------


def body_answer(
    body: bytes,
    *,
    status: int = 200,
    content_type: str | None = "application/json",
    encoding: str | None = None,
) -> Respond:
    headers = {"Content-Encoding": encoding} if encoding is not None else None
    return answer(http_response(status, body, headers=headers, content_type=content_type))


BAD_BODIES: dict[str, tuple[Respond, type[ResponseValidationError], str | None, str]] = {
    # name: (script, error, its .path, words in the message)
    "HTML": (
        body_answer(b"<html><body>Maintenance</body></html>", content_type="text/html"),
        ResponseValidationError,
        None,
        "not valid JSON",
    ),
    "truncated JSON": (body_answer(JOB[: len(JOB) // 2]), ResponseValidationError, None, "JSON"),
    "invalid JSON": (body_answer(b'{"id": "x",}'), ResponseValidationError, None, "JSON"),
    "JSON of the wrong schema": (
        body_answer(b'{"id": 7, "state": "done"}'),
        ResponseValidationError,
        "$.id",
        "does not fit ExtractionJob",
    ),
    "a JSON array": (body_answer(b"[]"), ResponseValidationError, "$", "does not fit"),
    "empty 200": (body_answer(b""), ResponseValidationError, None, "empty"),
    "204": (
        body_answer(b"", status=204, content_type=None),
        ResponseValidationError,
        None,
        "empty",
    ),
    "invalid UTF-8": (
        body_answer(b'{"id": "9b2e\xff\xfe", "name": "x"}'),
        ResponseValidationError,
        None,
        "UTF-8",
    ),
    "nesting past the decoder's depth": (
        body_answer(b'{"id": "x", "extraction": {"document": {"structured": ' + b"[" * 100_000),
        ResponseValidationError,
        None,
        "nested",
    ),
    "an unknown Content-Encoding": (
        body_answer(b"BROTLI?", encoding="br"),
        ResponseValidationError,
        None,
        "Content-Encoding 'br'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
async def test_bad_success_body(case: str, sleeps: list[float]) -> None:
    script, error, path, words = BAD_BODIES[case]
    async with raw_server(script) as server:
        result = await outcome(server, get_job)
    assert type(result) is error, repr(result)
    assert result.path == path
    assert words in str(result)
    assert result.attempts == 1
    assert server.requests == 1
    assert sleeps == []


async def test_valid_json_labelled_text_plain_is_decoded(sleeps: list[float]) -> None:
    # The Content-Type is not checked: a body that is the endpoint's JSON is accepted as such.
    async with raw_server(body_answer(JOB, content_type="text/plain; charset=latin-1")) as server:
        result = await outcome(server, get_job)
    assert isinstance(result, ExtractionJob)
    assert result.id == JOB_ID


def gzip_with_bad_crc() -> bytes:
    data = bytearray(gzip.compress(JOB))
    data[-6] ^= 0xFF  # the CRC-32 in the trailer
    return bytes(data)


BAD_COMPRESSION: dict[str, tuple[bytes, str]] = {
    "gzip with a wrong CRC": (gzip_with_bad_crc(), "not valid gzip data"),
    # Complete JSON inside, but the stream stops before its end: the CRC is never checked.
    "gzip without its trailer": (gzip.compress(JOB)[:-8], "ended before its gzip data"),
    "deflate cut short": (zlib.compress(JOB)[:-30], "ended before its deflate data"),
}


@pytest.mark.parametrize("case", list(BAD_COMPRESSION))
async def test_broken_compressed_body_is_a_connection_error_and_retried(
    case: str, sleeps: list[float]
) -> None:
    data, words = BAD_COMPRESSION[case]
    encoding = case.split()[0]
    async with raw_server(body_answer(data, encoding=encoding)) as server:
        result = await outcome(server, get_job, max_retries=1)
    assert type(result) is APIConnectionError, repr(result)
    assert words in str(result)
    assert result.attempts == 2
    assert server.requests == 2


LIMIT = 64 * 1024


def large_chunked(size: int) -> Respond:
    """A chunked 200 with no Content-Length, ``size`` bytes long, sent as the client reads."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        conn.writer.write(CHUNKED)
        piece = b" " * 8192
        try:
            for _ in range(size // len(piece)):
                conn.writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await conn.writer.drain()
            conn.writer.write(b"0\r\n\r\n")
        except ConnectionError:
            pass
        return False

    return respond


TOO_LARGE: dict[str, Respond] = {
    "declared by Content-Length": body_answer(b" " * (LIMIT + 1)),
    "chunked, no length given": large_chunked(4 * LIMIT),
    "a gzip bomb": body_answer(gzip_bomb(8 * 1024 * 1024), encoding="gzip"),
    "a deflate bomb": body_answer(zlib.compress(bytes(8 * 1024 * 1024), 9), encoding="deflate"),
}


@pytest.mark.parametrize("case", list(TOO_LARGE))
async def test_body_past_max_response_bytes(case: str, sleeps: list[float]) -> None:
    async with raw_server(TOO_LARGE[case]) as server:
        result = await outcome(server, get_job, max_response_bytes=LIMIT)
    assert type(result) is ResponseTooLargeError
    assert result.limit == LIMIT
    assert result.attempts == 1
    assert server.requests == 1


async def test_gzip_bomb_memory_stays_bounded(sleeps: list[float]) -> None:
    decompressed = 256 * 1024 * 1024
    bomb = gzip_bomb(decompressed)
    limit = 1024 * 1024
    async with raw_server(body_answer(bomb, encoding="gzip")) as server:
        client = make_client(server, max_response_bytes=limit)
        tracemalloc.start()
        try:
            async with asyncio.timeout(BOUND):
                with pytest.raises(ResponseTooLargeError):
                    await get_job(client)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await client.aclose()
        await server.wait_all_closed()
    # Peak includes the bomb as received and the server's copy; never the inflated 256 MiB.
    assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"
    assert peak < decompressed // 16


# -- many ids: bounded concurrency, cancellation, nothing left behind ------------------------------


async def test_5000_ids_never_exceed_the_concurrency(sleeps: list[float]) -> None:
    async with ServiceEmulator(api_key=API_KEY, seed=3, n_resources=5, n_jobs=50) as emu:
        known = [job["id"] for job in emu.jobs()]
        missing = str(uuid.UUID(int=12345, version=4))
        ids: list[str] = [known[i % len(known)] for i in range(5000)]
        ids[17] = missing  # a permanent failure
        ids[4000] = "not-an-id"  # and an invalid id
        emu.faults.set("extract", latency=0.001)
        async with make_client(emu.base_url) as client:
            async with asyncio.timeout(25 * TIME_SCALE):
                results = await client.gather_extractions(ids, concurrency=12)
            assert held_connections(client) == 0
        stats = emu.stats
        assert 1 < stats.max_in_flight <= 12
        assert stats.count("extract") == 4999
    assert [r.job_id for r in results] == ids
    assert isinstance(results[17].error, NotFoundError)
    assert isinstance(results[4000].error, InvalidRequestError)
    assert sum(r.ok for r in results) == 4998


def slow_jobs(delay: float) -> Respond:
    """Each request is answered after ``delay`` s with a job, then the connection is closed."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        if await pause(conn, delay):
            conn.writer.write(http_response(200, JOB))
            await conn.writer.drain()
        return False

    return respond


@pytest.mark.parametrize("how", ["gather", "iter", "backoff"])
async def test_cancelling_midway_closes_every_connection_at_once(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    script = statuses(503) if how == "backoff" else slow_jobs(0.2)
    ids = [JOB_ID] * 1000
    async with raw_server(script) as server:
        client = make_client(server, max_retries=5)
        if how == "backoff":
            # A real backoff sleep of 0.5 s (jitter pinned at its ceiling) to cancel in.
            client._shared.random.random = lambda: 1.0  # type: ignore[method-assign]
        if how == "iter":

            async def consume() -> None:
                async with client.iter_extractions(ids, concurrency=8) as results:
                    async for _ in results:
                        pass

            task: asyncio.Task[Any] = asyncio.create_task(consume())
        else:
            task = asyncio.create_task(client.gather_extractions(ids, concurrency=8))
        async with asyncio.timeout(BOUND):
            await server.wait_for_requests(8)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(3):
                await asyncio.sleep(0)
            assert client_tasks() == []
            assert held_connections(client) == 0
            if how != "backoff":
                # Connections in the middle of an answer are closed by the cancellation itself.
                await server.wait_all_closed(2.0)
            requests = server.requests
            await asyncio.sleep(0.6)
            assert server.requests == requests, "requests went on after the cancellation"
        await client.aclose()
        await server.wait_all_closed()
    del task
    gc.collect()
    assert loop_complaints(caplog.records) == []
    assert requests < 40


async def test_one_permanent_failure_never_aborts_the_others(sleeps: list[float]) -> None:
    bad = str(uuid.UUID(int=7, version=4))
    dropped: set[str] = set()

    async def respond(request: RawRequest, conn: Conn) -> bool:
        if bad in request.target:
            conn.writer.write(http_response(404, b'{"error": "no such job"}'))
        elif request.index % 7 == 3 and request.target not in dropped:
            dropped.add(request.target)
            conn.writer.transport.abort()  # a connection dropped now and then: retried
            return False
        else:
            job_id = request.target.rsplit("/", 1)[1]
            conn.writer.write(http_response(200, JOB.replace(JOB_ID.encode(), job_id.encode())))
        await conn.writer.drain()
        return True

    ids = [str(uuid.UUID(int=i + 100, version=4)) for i in range(60)]
    ids[10] = bad
    async with raw_server(respond) as server:
        results = await outcome(
            server, lambda c: c.gather_extractions(ids, concurrency=6), retry_budget=None
        )
    assert [r.job_id for r in results] == ids
    assert isinstance(results[10].error, APIStatusError)
    assert results[10].error.status_code == 404
    assert results[10].error.attempts == 1
    assert all(r.ok for i, r in enumerate(results) if i != 10)
    assert dropped
    assert server.requests == len(ids) + len(dropped)


# -- closing -------------------------------------------------------------------------------------


async def test_closing_with_requests_in_flight_and_in_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The webhook-logs call is held in its backoff until the client is closed: no bet that a
    # 503 is taken in within some milliseconds.
    in_backoff, closed = hold_backoff(monkeypatch)

    async def respond(request: RawRequest, conn: Conn) -> bool:
        if "webhook-logs" in request.target:
            conn.writer.write(http_response(503, b"{}"))
            await conn.writer.drain()
            return True
        return await stall(request, conn)

    async with raw_server(respond) as server:
        client = make_client(server, max_retries=3)
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(client.get_extraction(JOB_ID)) for _ in range(5)
        ]
        tasks.append(asyncio.create_task(client.list_webhook_logs(JOB_ID)))
        async with asyncio.timeout(BOUND):
            await server.wait_for_requests(6)
            await in_backoff.wait()  # the webhook-logs call now sleeps before its retry
            await client.aclose()
            closed.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_all_closed()
            assert all(type(o) is ClientClosedError for o in outcomes), outcomes
            attempts = [o.attempts if isinstance(o, ClientClosedError) else 0 for o in outcomes]
            # The call in backoff made one attempt: its second was stopped by the closing
            # before it had a connection, so nothing of it went out (not counted).
            assert attempts == [1, 1, 1, 1, 1, 1]
            with pytest.raises(ClientClosedError, match="closed"):
                await client.search("after close")
            with pytest.raises(ClientClosedError):
                client.iter_extractions([JOB_ID])
    assert server.connections == 6
    assert server.requests == 6
    assert client_tasks() == []


# -- redirects -----------------------------------------------------------------------------------


def redirect_once(location: Callable[[RawRequest], str], status: int = 302) -> Respond:
    """Redirect the first request to ``location(request)``; answer any later one with a job."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        if request.index == 0:
            conn.writer.write(http_response(status, b"", headers={"Location": location(request)}))
        else:
            conn.writer.write(http_response(200, JOB))
        await conn.writer.drain()
        return True

    return respond


async def test_same_origin_redirect_keeps_the_key_and_the_connection() -> None:
    async with raw_server(redirect_once(lambda r: "/moved" + r.target, 308)) as server:
        result = await outcome(server, get_job)
    assert isinstance(result, ExtractionJob)
    first, second = server.seen
    assert second.target == "/moved" + first.target
    assert second.headers["x-api-key"] == API_KEY
    assert result.id == JOB_ID


# {port}: the redirecting server's port; {other}: the port of a second server on 127.0.0.1.
CROSS_ORIGIN = {
    "another host, same port": "http://127.0.0.2:{port}/v2/extract/x",
    "localhost for 127.0.0.1": "http://localhost:{port}/v2/extract/x",
    "another port": "http://127.0.0.1:{other}/v2/extract/x",
    "scheme-relative //other": "//127.0.0.2:{port}/v2/extract/x",
    "user@other": "http://user@127.0.0.2:{port}/v2/extract/x",
    "host:port@other": "http://127.0.0.1:{port}@127.0.0.2:{port}/v2/extract/x",
    "user info on the same origin": "http://user:pw@127.0.0.1:{port}/v2/extract/x",
    "http to https": "https://127.0.0.1:{port}/v2/extract/x",
    "a tab inside the host": "http://127.0.0.\t2:{port}/v2/extract/x",
}


@pytest.mark.parametrize("case", list(CROSS_ORIGIN))
async def test_cross_origin_redirect_is_not_followed(case: str, sleeps: list[float]) -> None:
    async with raw_server(stall) as other_port:
        location_for: dict[str, str] = {}

        def location(request: RawRequest) -> str:
            return location_for["value"]

        async with raw_server(redirect_once(location)) as server:
            location_for["value"] = CROSS_ORIGIN[case].format(
                port=server.port, other=other_port.port
            )
            async with raw_server(stall, host="127.0.0.2", port=server.port) as other_host:
                result = await outcome(server, get_job)
    assert isinstance(result, APIStatusError), repr(result)
    assert result.status_code == 302
    assert "not followed" in str(result)
    assert result.attempts == 1
    assert (server.connections, server.requests) == (1, 1)
    assert other_host.connections == 0
    assert other_port.connections == 0


async def test_backslash_location_stays_on_the_origin(sleeps: list[float]) -> None:
    # Browsers read "/\\host" as "//host"; HTTP clients must not, and the key must not leave.
    async with (
        raw_server(redirect_once(lambda r: "/\\127.0.0.2/v2/extract/x")) as server,
        raw_server(stall, host="127.0.0.2", port=server.port) as other_host,
    ):
        result = await outcome(server, get_job)
    assert other_host.connections == 0
    assert isinstance(result, ExtractionJob)
    assert server.requests == 2


async def test_redirect_loop_between_two_paths(sleeps: list[float]) -> None:
    async def respond(request: RawRequest, conn: Conn) -> bool:
        target = "/b" if request.target.startswith("/a") else "/a"
        conn.writer.write(http_response(301, b"", headers={"Location": target}))
        await conn.writer.drain()
        return True

    async with raw_server(respond) as server:
        result = await outcome(server, lambda c: c.search("loop"), max_redirects=4)
    assert type(result) is APIStatusError
    assert "more than 4 redirects" in str(result)
    assert result.method == "POST"  # the call's, though the 301 turned the next request to GET
    assert result.attempts == 1
    assert server.requests == 5
    assert server.connections == 1
    # A 301 to a POST becomes a GET without the body, as browsers and aiohttp do.
    assert [r.method for r in server.seen] == ["POST", "GET", "GET", "GET", "GET"]
    assert all(r.body == b"" for r in server.seen[1:])


async def test_redirect_without_location_is_an_error(sleeps: list[float]) -> None:
    async with raw_server(answer(http_response(302, b""))) as server:
        result = await outcome(server, get_job)
    assert type(result) is APIStatusError
    assert "without a Location" in str(result)
    assert server.requests == 1


# -- which failures are retried once the request may have reached the server ----------------------
# A search that is not incognito adds a history entry each time the service runs it: by default it
# is sent again only after failures that show it was not acted on (retry_search="safe").

EMPTY_PAGE = b'{"total": 0, "hasMore": false, "hits": []}'


def search_answers(*codes: int) -> Respond:
    """Answer the n-th request with the n-th status (the last one repeats); 200 is an empty page."""

    async def respond(request: RawRequest, conn: Conn) -> bool:
        code = codes[min(request.index, len(codes) - 1)]
        body = EMPTY_PAGE if code == 200 else json.dumps({"error": {"message": "x"}}).encode()
        conn.writer.write(http_response(code, body))
        await conn.writer.drain()
        return True

    return respond


async def first_page(client: AsyncSearchClient) -> object:
    async with client.search_pages("q") as pages:
        return await anext(pages)


SENT_AGAIN: dict[str, tuple[Call, dict[str, Any], int]] = {
    # name: (call, client options, requests the server reads before the call gives up)
    "search": (lambda c: c.search("q"), {}, 1),
    "search, incognito=False": (lambda c: c.search("q", incognito=False), {}, 1),
    "search, lean": (lambda c: c.search("q", embeddings=False), {}, 1),
    "search, raw response": (lambda c: c.with_raw_response.search("q"), {}, 1),
    "search_pages": (first_page, {}, 1),
    "search, incognito": (lambda c: c.search("q", incognito=True), {}, 3),
    "search, retry_search='always'": (lambda c: c.search("q"), {"retry_search": "always"}, 3),
    "search, with_options(retry_search='always')": (
        lambda c: c.with_options(retry_search="always").search("q"),
        {},
        3,
    ),
    "search, with_options(retry_search='safe')": (
        lambda c: c.with_options(retry_search="safe").search("q"),
        {"retry_search": "always"},
        1,
    ),
    # Decided from the body as sent (issue 27): extra_body's incognito wins over the argument.
    "search, incognito, extra_body not incognito": (
        lambda c: c.search("q", incognito=True, extra_body={"incognito": False}),
        {},
        1,
    ),
    "search, extra_body incognito": (
        lambda c: c.search("q", extra_body={"incognito": True}),
        {},
        3,
    ),
    "get_extraction": (get_job, {}, 3),
    "list_webhook_logs": (lambda c: c.list_webhook_logs(JOB_ID), {}, 3),
}


@pytest.mark.parametrize("case", list(SENT_AGAIN))
async def test_dropped_after_the_body_was_read(case: str, sleeps: list[float]) -> None:
    call, options, requests = SENT_AGAIN[case]
    async with raw_server(close_at_once) as server:
        result = await outcome(server, call, max_retries=2, **options)
    assert isinstance(result, APIConnectionError)
    assert result.request_sent is True
    assert result.attempts == requests
    # The server read every request whole, body included, before it dropped the connection.
    assert server.requests == requests
    for seen in server.seen:
        assert len(seen.body) == int(seen.headers.get("content-length", "0"))
        if seen.method == "POST":
            assert json.loads(seen.body)["text"] == "q"
    assert len(sleeps) == requests - 1


STATUS_SENT_AGAIN: dict[str, tuple[tuple[int, ...], bool, int]] = {
    # name: (answers, incognito, requests); a 200 ends the call
    "408": ((408, 200), False, 2),
    "429": ((429, 200), False, 2),
    "503": ((503, 503, 200), False, 3),
    "500": ((500, 200), False, 1),
    "502": ((502, 200), False, 1),
    "504": ((504, 200), False, 1),
    "500, incognito": ((500, 500, 200), True, 3),
    "502, incognito": ((502, 200), True, 2),
}


@pytest.mark.parametrize("case", list(STATUS_SENT_AGAIN))
async def test_error_answers_to_a_search(case: str, sleeps: list[float]) -> None:
    answers, incognito, requests = STATUS_SENT_AGAIN[case]
    async with raw_server(search_answers(*answers)) as server:
        result = await outcome(server, lambda c: c.search("q", incognito=incognito or None))
    assert server.requests == requests
    if answers[requests - 1] == 200:
        assert isinstance(result, SearchPage)
    else:
        assert isinstance(result, InternalServerError)
        assert result.status_code == answers[0]
        assert result.attempts == 1


async def test_a_search_is_retried_when_the_connection_never_opened(sleeps: list[float]) -> None:
    import socket

    with socket.socket() as holder:
        # Bound but not listening: connecting is refused, and no other process can take the port.
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        client = make_client(f"http://127.0.0.1:{port}", max_retries=2)
        async with asyncio.timeout(BOUND):
            with pytest.raises(APIConnectionError, match="connection failed") as info:
                await client.search("q")
        await client.aclose()
    assert info.value.request_sent is False
    assert info.value.attempts == 3
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    ("error", "sent"),
    [
        (aiohttp.ConnectionTimeoutError("Connection timeout to host"), False),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), True),
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), True),
        (TimeoutError(), True),
        (aiohttp.ClientPayloadError("Response payload is not completed"), True),
    ],
)
def test_errors_say_whether_the_request_may_have_been_sent(error: Exception, sent: bool) -> None:
    translated = _translate(error)
    assert isinstance(translated, APIConnectionError)
    assert translated.request_sent is sent
