"""aiohttp client middlewares (``middlewares=``) on the client, ``with_options`` and a call."""

from __future__ import annotations

import asyncio
import gzip
import socket
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchClient,
    ConfigurationError,
    InvalidRequestError,
    MiddlewareError,
    ResponseTooLargeError,
    Timeout,
    _call,
)

from .conftest import API_KEY, JOB_ID
from .helpers import TIME_SCALE
from .test_call_options import Serve

pytestmark = pytest.mark.timeout(30)

JOB = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)


def counting(seen: list[str]) -> Any:
    async def middleware(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        seen.append(request.url.path)
        return await handler(request)

    return middleware


async def test_a_client_middleware_sees_every_attempt_and_a_call_s_only_its_call(
    serve: Serve,
) -> None:
    answers = [503, 503]

    async def handler(request: web.Request) -> web.StreamResponse:
        if answers:
            return web.Response(status=answers.pop(0))
        return web.Response(body=JOB, content_type="application/json")

    server = await serve(handler)
    every: list[str] = []
    one: list[str] = []
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[counting(every)]
    ) as client:
        response = await client.with_raw_response.get_extraction(
            JOB_ID, middlewares=[counting(one)]
        )
        assert response.attempts == 3
        assert len(every) == 3
        assert len(one) == 3
        await client.get_extraction(JOB_ID)
        await client.with_options(middlewares=()).get_extraction(JOB_ID)
    assert len(every) == 4  # not on the client made without it
    assert len(one) == 3  # its call only
    assert len(server.seen) == 5


async def test_a_middleware_adds_a_header(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=JOB, content_type="application/json")

    async def tag(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        request.headers["X-Tag"] = "mw"
        return await handler(request)

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        await client.get_extraction(JOB_ID, middlewares=[tag])
    assert server.seen[0].headers["X-Tag"] == "mw"
    assert server.seen[0].headers["X-Api-Key"] == API_KEY


@pytest.mark.parametrize("quoted", ["text", "object"])
async def test_a_middleware_that_raises_does_not_leak_the_key(serve: Serve, quoted: str) -> None:
    """Its own error, raised as it is (not taken for a connection failure and retried), with the
    key scrubbed from the whole chain: string and non-string arguments, causes and contexts."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=JOB, content_type="application/json")

    async def broken(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        headers = dict(request.headers)
        try:
            raise KeyError(f"no audit sink for {headers}")
        except KeyError as exc:
            if quoted == "text":
                raise RuntimeError(f"refusing {headers}") from exc
            raise RuntimeError("refusing", headers)  # noqa: B904 (the context quotes it too)

    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[broken]) as client:
        with pytest.raises(RuntimeError) as caught:
            await client.get_extraction(JOB_ID)
    error = caught.value
    assert type(error) is RuntimeError
    assert "refusing" in str(error)
    shown = "".join(traceback.format_exception(error)) + repr(error) + repr(error.args)
    assert "[redacted]" in shown
    assert API_KEY not in shown
    assert server.seen == []


async def test_redirects_stay_same_origin_with_middlewares(serve: Serve) -> None:
    other = await serve(lambda request: _job())

    async def handler(request: web.Request) -> web.StreamResponse:
        go = request.query.get("go")
        if go == "moved":
            raise web.HTTPFound(f"/v2/extract/{JOB_ID}?go=here")
        if go == "away":
            raise web.HTTPFound(f"{other.base_url}/v2/extract/{JOB_ID}")
        return await _job()

    server = await serve(handler)
    queries: list[str] = []

    async def record(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        queries.append(request.url.query.get("go", ""))
        return await handler(request)

    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[record]) as client:
        await client.get_extraction(JOB_ID, extra_query={"go": "moved"})
        assert queries == ["moved", "here"]  # the middleware sees each request sent
        with pytest.raises(APIStatusError, match="another origin"):
            await client.get_extraction(JOB_ID, extra_query={"go": "away"})
    assert other.seen == []  # the key went nowhere else
    assert len(server.seen) == 3


async def test_middlewares_are_refused_with_a_session_of_your_own(serve: Serve) -> None:
    server = await serve(lambda request: _job())
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ConfigurationError, match="session"):
            AsyncSearchClient(
                API_KEY, base_url=server.base_url, session=session, middlewares=[counting([])]
            )
        async with AsyncSearchClient(API_KEY, base_url=server.base_url, session=session) as c:
            with pytest.raises(ConfigurationError, match="session"):
                c.with_options(middlewares=[counting([])])
            with pytest.raises(InvalidRequestError, match="session"):
                await c.get_extraction(JOB_ID, middlewares=[counting([])])
            await c.get_extraction(JOB_ID)
    assert len(server.seen) == 1


def test_middlewares_are_checked() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")
    for bad in ("mw", [1], object()):
        with pytest.raises(ConfigurationError, match="middlewares"):
            client.with_options(middlewares=bad)  # type: ignore[arg-type]


async def _job() -> web.Response:
    return web.Response(body=JOB, content_type="application/json")


async def test_a_middleware_sending_a_request_twice_is_refused(serve: Serve) -> None:
    """Retries are the client's (counted, backed off): a hidden resend is refused, as aiohttp's."""
    server = await serve(lambda request: _job())

    async def twice(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        first = await handler(request)
        first.release()
        return await handler(request)

    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[twice]) as client:
        with pytest.raises(MiddlewareError, match="sent the request a second time") as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.attempts == 1  # a clear error at once: not retried as a connection error
    assert caught.value.retries_stopped is None
    assert len(server.seen) == 1


async def test_a_call_s_middlewares_run_inside_the_client_s(serve: Serve) -> None:
    server = await serve(lambda request: _job())
    order: list[str] = []

    def named(name: str) -> Any:
        async def middleware(
            request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
        ) -> aiohttp.ClientResponse:
            order.append(f"{name} in")
            response = await handler(request)
            order.append(f"{name} out")
            return response

        return middleware

    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[named("client")]
    ) as client:
        await client.get_extraction(JOB_ID, middlewares=[named("call"), named("call 2")])
    assert order == ["client in", "call in", "call 2 in", "call 2 out", "call out", "client out"]


SEARCH_PAGE = (Path(__file__).parent / "samples" / "search_page.json").read_bytes()


class AuditDown(Exception):
    """The audit sink of a middleware is down."""


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port bound by a socket that does not listen: connecting to it is refused, and
    nothing else can take the port meanwhile (a port bound and then closed could be reused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("sink", ["its own error", "an aiohttp connect error"])
@pytest.mark.parametrize("call", ["search", "get_extraction"])
async def test_a_middleware_failing_after_the_answer_is_raised_as_is_and_not_resent(
    serve: Serve, sink: str, call: str, refusing_port: int
) -> None:
    """The answer came: whatever a middleware raises afterwards is its own, never "not sent".

    A non-incognito search reached the service 3 times when the audit sink's connection error
    was taken for the request's own (retry_search="safe" retries only unsent searches).
    """
    server = await serve(
        lambda request: web.Response(
            body=SEARCH_PAGE if "search" in request.path else JOB, content_type="application/json"
        )
    )
    sink_url = f"http://127.0.0.1:{refusing_port}/audit"

    async def audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        if sink == "its own error":
            raise AuditDown(f"the audit sink at {sink_url} is down")
        async with aiohttp.ClientSession() as session:
            await session.post(sink_url, data=b"{}")
        return response

    expected = AuditDown if sink == "its own error" else aiohttp.ClientConnectorError
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[audit]) as client:
        sending = client.search("invoice") if call == "search" else client.get_extraction(JOB_ID)
        with pytest.raises(expected):
            await sending
    assert len(server.seen) == 1


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


async def _answer(request: web.Request, body: bytes, *, gzipped: bool, chunked: bool) -> Any:
    headers = {"Content-Type": "application/json"}
    if gzipped:
        body = _gzip(body)
        headers["Content-Encoding"] = "gzip"
    if not chunked:
        return web.Response(body=body, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    await response.prepare(request)
    for start in range(0, len(body), 65536):
        await response.write(body[start : start + 65536])
    await response.write_eof()
    return response


async def _reading(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    response = await handler(request)
    await response.read()  # say, to log it
    return response


@pytest.mark.parametrize("gzipped", [False, True], ids=["identity", "gzip"])
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_a_body_a_middleware_read_is_still_the_client_s(
    serve: Serve, gzipped: bool, chunked: bool
) -> None:
    server = await serve(lambda request: _answer(request, JOB, gzipped=gzipped, chunked=chunked))
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[_reading]
    ) as client:
        job = await client.get_extraction(JOB_ID)
    assert str(job.id) == JOB_ID


@pytest.mark.parametrize("gzipped", [False, True], ids=["identity", "gzip"])
async def test_a_body_a_middleware_read_is_still_capped(serve: Serve, gzipped: bool) -> None:
    big = b'{"id": "' + b"x" * 3_000_000 + b'"}'
    server = await serve(lambda request: _answer(request, big, gzipped=gzipped, chunked=True))
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[_reading], max_response_bytes=1_000_000
    ) as client:
        with pytest.raises(ResponseTooLargeError, match="1000000 bytes"):
            await client.get_extraction(JOB_ID)


# -- found by a review: where a middleware's own work meets the record of the request --------


@pytest.mark.parametrize("call", ["search", "get_extraction"])
async def test_a_middleware_s_own_timeout_after_the_answer_is_its_own(
    serve: Serve, call: str
) -> None:
    """Its own ``asyncio.timeout`` (a slow audit sink) is not the attempt's total timeout: raised
    as it is, the request sent once (it was retried 3 times as the SDK's own timeout)."""
    server = await serve(
        lambda request: web.Response(
            body=SEARCH_PAGE if "search" in request.path else JOB, content_type="application/json"
        )
    )
    never = asyncio.Event()

    async def slow_audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        async with asyncio.timeout(0.01):
            await never.wait()  # the sink never answers
        return response

    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[slow_audit]
    ) as client:
        sending = client.search("invoice") if call == "search" else client.get_extraction(JOB_ID)
        with pytest.raises(TimeoutError) as caught:
            await sending
    assert not isinstance(caught.value, APITimeoutError)
    assert len(server.seen) == 1


async def test_an_answer_a_failing_middleware_holds_keeps_no_connection(serve: Serve) -> None:
    """The error's traceback keeps the middleware's frame, and with it the answer, unreleased:
    with a pool of one, the next call waited inside aiohttp until its total timeout."""
    big = b'{"id": "' + b"x" * 2_000_000 + b'"}'  # more than aiohttp reads ahead unasked
    bodies = [big, JOB]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=bodies.pop(0), content_type="application/json")

    server = await serve(handler)
    failing = [True]

    async def audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)  # not released: the error's traceback keeps it
        if failing.pop():
            raise AuditDown("the audit sink is down")
        return response

    async with AsyncSearchClient(
        API_KEY,
        base_url=server.base_url,
        max_connections=1,
        middlewares=[audit],
        timeout=Timeout(total=10 * TIME_SCALE),
    ) as client:
        with pytest.raises(AuditDown) as kept:  # kept: its traceback holds the answer
            await client.get_extraction(JOB_ID)
        failing.append(False)
        async with asyncio.timeout(5 * TIME_SCALE):
            assert str((await client.get_extraction(JOB_ID)).id) == JOB_ID
    assert kept.value.__traceback__ is not None
    assert len(server.seen) == 2


async def test_a_body_cut_while_a_middleware_reads_it_is_the_request_s_failure() -> None:
    """The connection dropped mid-body: retried as without the middleware (it came out as
    aiohttp's own ClientPayloadError, raw and not retried)."""
    answers = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answers
        await reader.readuntil(b"\r\n\r\n")
        answers += 1
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        if answers == 1:  # the first answer is cut in the middle of its body
            writer.write(head % len(JOB) + b"\r\n" + JOB[:50])
        else:
            writer.write(head % len(JOB) + b"Connection: close\r\n\r\n" + JOB)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=f"http://127.0.0.1:{port}", middlewares=[_reading]
        ) as client:
            job = await client.get_extraction(JOB_ID)
    finally:
        server.close()
        await server.wait_closed()
    assert str(job.id) == JOB_ID
    assert answers == 2


async def test_a_middleware_s_own_disconnect_after_the_answer_is_not_a_resend(
    serve: Serve,
) -> None:
    """aiohttp takes a ServerDisconnectedError out of the middlewares for a stale connection and
    runs them all again: the middleware's own error must reach the caller, once, as it is (it
    became a MiddlewareError blaming a second send)."""
    server = await serve(lambda request: _job())
    runs = 0

    async def audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        nonlocal runs
        runs += 1
        await handler(request)
        raise aiohttp.ServerDisconnectedError()  # its own sink's connection dropped

    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[audit]) as client:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.get_extraction(JOB_ID)
    assert runs == 1
    assert len(server.seen) == 1


@pytest.mark.parametrize("how", ["a group", "bytes"])
async def test_the_key_is_scrubbed_from_groups_and_bytes(serve: Serve, how: str) -> None:
    server = await serve(lambda request: _job())

    async def quoting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        echoed = repr(dict(request.headers)).encode()  # a body that echoed the headers
        if how == "bytes":
            raise AuditDown("the sink refused", echoed)
        raise ExceptionGroup("audit", [AuditDown("refused", echoed.decode())])

    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[quoting]
    ) as client:
        with pytest.raises(Exception) as caught:
            await client.get_extraction(JOB_ID)
    assert isinstance(caught.value, AuditDown | ExceptionGroup)
    shown = "".join(traceback.format_exception(caught.value)) + repr(caught.value.args)
    assert API_KEY not in shown
    assert "[redacted]" in shown


async def test_a_middleware_error_s_notes_are_scrubbed_of_the_key(serve: Serve) -> None:
    """A note quoting the key (``add_note``) reaches the caller without it; the error is the
    middleware's own, of its own type, its other notes kept."""
    server = await serve(lambda request: _job())
    raised: list[AuditDown] = []

    async def noting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        error = AuditDown("the sink refused")
        error.add_note(f"sent {request.headers['X-Api-Key']}")
        error.add_note("audit sink: down")
        raised.append(error)
        raise error

    async with AsyncSearchClient(API_KEY, base_url=server.base_url, middlewares=[noting]) as client:
        with pytest.raises(AuditDown) as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value is raised[0]
    notes = caught.value.__notes__
    assert notes == ["sent [redacted]", "audit sink: down"]
    assert API_KEY not in "".join(traceback.format_exception(caught.value))
    assert server.seen == []


@pytest.mark.parametrize("kind", [bytes, bytearray])
async def test_a_middleware_error_s_bytes_argument_stays_bytes(
    serve: Serve, kind: type[bytes | bytearray]
) -> None:
    """A ``bytes`` (or ``bytearray``) argument quoting the key is scrubbed, still of its type,
    and the caller's own object is left as it was."""
    server = await serve(lambda request: _job())
    echoed: list[bytes | bytearray] = []

    async def quoting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        body = kind(b"echo: key=" + request.headers["X-Api-Key"].encode() + b";")
        echoed.append(body)
        raise AuditDown("the sink refused", body)

    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[quoting]
    ) as client:
        with pytest.raises(AuditDown) as caught:
            await client.get_extraction(JOB_ID)
    message, body = caught.value.args
    assert message == "the sink refused"
    assert type(body) is kind
    assert body == b"echo: key=[redacted];"
    assert API_KEY not in "".join(traceback.format_exception(caught.value))
    assert echoed[0] == kind(b"echo: key=" + API_KEY.encode() + b";")  # the caller's, untouched
    assert server.seen == []


async def test_a_middleware_s_own_error_in_a_bulk_call_fails_only_its_id(serve: Serve) -> None:
    server = await serve(lambda request: _job())
    refused = {"00000000-0000-4000-8000-000000000002"}

    async def audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        if request.url.path.rsplit("/", 1)[1] in refused:
            raise AuditDown("the audit sink is down")
        return response

    ids = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 5)]
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_connections=1, middlewares=[audit]
    ) as client:
        async with asyncio.timeout(10 * TIME_SCALE):
            results = await client.gather_extractions(ids, concurrency=4)
    assert [r.ok for r in results] == [True, False, True, True]
    failed = results[1].error
    assert failed is not None
    assert "a middleware raised AuditDown" in str(failed)
    assert isinstance(failed.__cause__, AuditDown)
    assert len(server.seen) == 4


async def test_a_search_answered_with_a_redirect_counts_as_sent_if_the_redirect_fails() -> None:
    """The search POST was answered 303 (the service acted on it); its same-origin GET cannot
    connect: the attempt went out, so the search is not sent again (it was: request_sent=False)."""
    posts = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal posts
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        posts += 1
        server.close()  # the listener is gone: the redirect's GET is refused
        writer.write(
            b"HTTP/1.1 303 See Other\r\nLocation: /v2/search/result\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with AsyncSearchClient(API_KEY, base_url=f"http://127.0.0.1:{port}") as client:
        with pytest.raises(APIConnectionError) as caught:
            await client.search("invoice")
    await server.wait_closed()
    assert caught.value.request_sent is True
    assert caught.value.attempts == 1  # not retried: retry_search="safe"
    assert posts == 1
