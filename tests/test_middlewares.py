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
    APIStatusError,
    AsyncSearchClient,
    ConfigurationError,
    InvalidRequestError,
    MiddlewareError,
    ResponseTooLargeError,
    _call,
)

from .conftest import API_KEY, JOB_ID
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
