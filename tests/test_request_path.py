"""Which aiohttp path a request takes, over real loopback sockets.

The client's own session sends through ``_transport._start``, below ``ClientSession.request``;
a caller's session, ``trust_env=True``, trace configs a tracer added to the session, or a
``ClientSession._request`` that something patched (aioresponses) go through ``session.request``.
Both paths keep no cookies and run the fault matrix alike (``tests/test_faults.py`` runs on both,
see the ``request_path`` fixture).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from asyncsearch import APITimeoutError, AsyncSearchClient, Timeout, _transport

from .conftest import API_KEY, JOB_ID, Handler, Server
from .helpers import TIME_SCALE

Serve = Callable[[Handler], Awaitable[Server]]
JOB_BODY = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()

pytestmark = pytest.mark.timeout(30)

needs_direct = pytest.mark.skipif(
    not _transport._DIRECT_REQUESTS,
    reason="this aiohttp lacks a part the direct path calls: every request uses session.request",
)


def job_answer(**headers: str) -> web.Response:
    return web.Response(body=JOB_BODY, content_type="application/json", headers=headers)


def count_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the method of every request that takes the direct path."""
    started: list[str] = []
    real_start = _transport._start

    async def start(*args: Any, **kwargs: Any) -> aiohttp.ClientResponse:
        started.append(args[1])  # _start(direct, method, url, ...)
        return await real_start(*args, **kwargs)

    monkeypatch.setattr(_transport, "_start", start)
    return started


async def answering(serve: Serve) -> Server:
    async def answer(request: web.Request) -> web.Response:
        return job_answer()

    return await serve(answer)


@needs_direct
async def test_the_clients_own_session_sends_below_session_request(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = count_starts(monkeypatch)
    server = await answering(serve)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        jobs = await client.gather_extractions([JOB_ID] * 3)
    assert [job.ok for job in jobs] == [True] * 3
    assert started == ["GET"] * 3


def test_the_direct_path_is_on_for_every_aiohttp_the_suite_supports() -> None:
    """The direct path is not silently lost on a supported aiohttp (its cases would skip)."""
    version = tuple(int(part) for part in aiohttp.__version__.split(".")[:2])
    if version >= (3, 15):
        pytest.skip(f"aiohttp {aiohttp.__version__} is newer than the releases checked (3.11-3.14)")
    assert _transport._DIRECT_REQUESTS


async def test_a_tracer_added_by_wrapping_session_init_sees_every_request(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenTelemetry's and Sentry's aiohttp integrations add a TraceConfig to every session."""
    started = count_starts(monkeypatch)
    traced: list[str] = []

    async def on_request_start(
        session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestStartParams
    ) -> None:
        traced.append(params.method)

    real_init = aiohttp.ClientSession.__init__

    def init(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        config = aiohttp.TraceConfig()
        config.on_request_start.append(on_request_start)
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or []), config]
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", init)
    server = await answering(serve)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        jobs = await client.gather_extractions([JOB_ID] * 3)
    assert [job.ok for job in jobs] == [True] * 3
    assert traced == ["GET"] * 3
    assert started == []


async def test_a_patched_session_request_sees_every_request(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool that patches ``ClientSession._request`` (a tracer, a mock) sees every request."""
    started = count_starts(monkeypatch)
    seen: list[str] = []
    real_request = aiohttp.ClientSession._request

    async def traced(
        self: aiohttp.ClientSession, method: str, url: Any, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        seen.append(method)
        return await real_request(self, method, url, **kwargs)

    server = await answering(serve)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        await client.get_extraction(JOB_ID)  # the session exists before the patch
        monkeypatch.setattr(aiohttp.ClientSession, "_request", traced)
        jobs = await client.gather_extractions([JOB_ID] * 3)
    assert [job.ok for job in jobs] == [True] * 3
    assert seen == ["GET"] * 3
    assert len(started) == (1 if _transport._DIRECT_REQUESTS else 0)  # only the one before


async def test_trust_env_and_a_callers_session_go_through_session_request(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxies and netrc from the environment, and a caller's session settings, are looked up
    by ``session.request`` only."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(Path(__file__).parent / "no-such-netrc"))
    started = count_starts(monkeypatch)
    server = await answering(serve)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, trust_env=True) as client:
        assert (await client.get_extraction(JOB_ID)).id == JOB_ID
    async with (
        aiohttp.ClientSession() as session,
        AsyncSearchClient(API_KEY, base_url=server.base_url, session=session) as client,
    ):
        assert (await client.get_extraction(JOB_ID)).id == JOB_ID
    assert started == []


@pytest.mark.usefixtures("request_path")
async def test_the_clients_own_session_keeps_no_cookies(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cookie the server sets is never sent back: no request carries an earlier answer's
    state, on either path."""
    cookies: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        return job_answer(**{"Set-Cookie": "session=abc; Path=/"})

    server = await serve(answer)
    # A host name, not an IP address: aiohttp's cookie jar refuses cookies from IP addresses.
    # It resolves to the server's loopback address only, and nothing else is ever looked up.
    loop = asyncio.get_running_loop()
    real_getaddrinfo = loop.getaddrinfo
    port = int(server.base_url.rsplit(":", 1)[1])

    async def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        assert host == "api.test", host
        return await real_getaddrinfo("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    # Where aiodns is installed it is aiohttp's default resolver: use the one that asks the loop.
    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", aiohttp.ThreadedResolver)
    async with AsyncSearchClient(
        API_KEY, base_url=f"http://api.test:{port}", allow_http=True
    ) as client:
        for _ in range(3):
            await client.get_extraction(JOB_ID)
    assert cookies == [None, None, None]


@pytest.mark.usefixtures("request_path")
async def test_total_covers_the_body_read_after_the_headers(serve: Serve) -> None:
    """``total`` still runs once the status and headers are in: a body that trickles in with
    every gap under ``read`` is cut at ``total``."""
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        slow = web.StreamResponse(headers={"Content-Type": "application/json"})
        slow.content_length = 10_000
        await slow.prepare(request)
        try:
            while not release.is_set():
                await slow.write(b" ")
                await asyncio.sleep(0.02)
        except (ConnectionError, RuntimeError):
            pass  # the client hung up, as it should
        return slow

    server = await serve(answer)
    timeout = Timeout(total=0.3, read=5.0)
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=server.base_url, timeout=timeout, max_retries=0
        ) as client:
            with pytest.raises(APITimeoutError, match="total timeout"):
                async with asyncio.timeout(10 * TIME_SCALE):  # the whole body would take 200 s
                    await client.get_extraction(JOB_ID)
    finally:
        release.set()
