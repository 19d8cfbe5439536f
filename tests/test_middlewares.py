"""aiohttp client middlewares (``middlewares=``) on the client, ``with_options`` and a call."""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    AsyncSearchClient,
    ConfigurationError,
    InvalidRequestError,
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


async def test_a_middleware_that_raises_does_not_leak_the_key(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=JOB, content_type="application/json")

    async def broken(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        raise RuntimeError(f"refusing {dict(request.headers)}")

    server = await serve(handler)
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[broken], max_retries=0
    ) as client:
        with pytest.raises(APIConnectionError) as caught:
            await client.get_extraction(JOB_ID)
    error = caught.value
    assert "refusing" in str(error)
    shown = "".join(traceback.format_exception(error)) + repr(error) + repr(error.args)
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

    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, middlewares=[twice], max_retries=0
    ) as client:
        with pytest.raises(APIConnectionError, match="a middleware sent the request a second"):
            await client.get_extraction(JOB_ID)
    assert len(server.seen) == 1
