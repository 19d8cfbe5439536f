"""AsyncSearchClient over real loopback sockets: what reaches the server, and what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import inspect
import json
import logging
import threading
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import asyncsearch
from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchClient,
    ClientClosedError,
    ConfigurationError,
    EventLoopMismatchError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ResponseTooLargeError,
    ResponseValidationError,
    Timeout,
    _call,
)

from .conftest import API_KEY, JOB_ID, LOG_ID, Handler, Server

SAMPLES = Path(__file__).parent / "samples"
Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(20)


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def json_answer(body: bytes, status: int = 200, **headers: str) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def routes(table: dict[str, bytes]) -> Handler:
    """A handler answering by the path's last segment kind."""

    async def handler(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.endswith("/v2/search"):
            return json_answer(table["search"])
        if path.endswith("/v2/link"):
            return json_answer(table["link"])
        if "/webhook-logs/" in path:
            return json_answer(table["webhook_log"])
        if path.endswith("/webhook-logs"):
            return json_answer(table["webhook_logs"])
        if "/v2/extract/" in path:
            return json_answer(table["extract"])
        return web.Response(status=599)

    return handler


SAMPLE_ROUTES = {
    "search": sample("search_page.json"),
    "link": sample("link_preview.json"),
    "webhook_log": sample("webhook_log.json"),
    "webhook_logs": sample("webhook_logs.json"),
    "extract": sample("extraction_job.json"),
}


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff sleeps are recorded and skipped, so retry tests are fast and exact."""
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)
    return delays


def make_client(server: Server, prefix: str = "", **options: Any) -> AsyncSearchClient:
    return AsyncSearchClient(API_KEY, base_url=server.base_url + prefix, **options)


# -- every endpoint: the request on the wire and the typed result ---------------------------------


async def test_a_base_url_path_with_a_space_or_non_ascii_goes_out_percent_encoded(
    serve: Serve,
) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    async with make_client(server, "/my api/d\u00e9p\u00f4t/", max_retries=0) as client:
        job = await client.get_extraction(JOB_ID)
    assert job.id == JOB_ID
    # The request line as the server read it, before any decoding.
    assert [seen.path for seen in server.seen] == [f"/my%20api/d%C3%A9p%C3%B4t/v2/extract/{JOB_ID}"]


@pytest.mark.parametrize("prefix", ["", "/api", "/api/"])
async def test_every_endpoint_request_and_decoding(serve: Serve, prefix: str) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    base = prefix.rstrip("/")
    async with make_client(server, prefix, base_id="base-7") as client:
        page = await client.search("report", filters={"kinds": ["document"]}, page=2, page_size=10)
        job = await client.get_extraction(JOB_ID, format="markdown")
        preview = await client.link_preview("https://example.com/a?b=1&c=2", type="link")
        logs = await client.list_webhook_logs(JOB_ID)
        log = await client.get_webhook_log(JOB_ID, LOG_ID)

    assert isinstance(page, asyncsearch.SearchPage)
    assert page.total == 42
    assert page.hits[0].embeddings is not None
    assert len(page.hits[0].embeddings.small3_512) == 512
    assert isinstance(job, asyncsearch.ExtractionJob)
    assert job.id == "9b2e4c6a-1d3f-4a5b-8c7d-0e1f2a3b4c5d"
    assert isinstance(preview, asyncsearch.LinkPreview)
    assert preview.metadata == {"og:locale": "en_US"}
    assert [type(item) for item in logs] == [asyncsearch.WebhookLogSummary]
    assert isinstance(log, asyncsearch.WebhookLog)
    assert log.response_body == "<html>bad gateway</html>"

    search, extract, link, list_logs, one_log = server.seen
    assert (search.method, search.path) == ("POST", f"{base}/v2/search")
    assert json.loads(search.body) == {
        "text": "report",
        "filters": {"kinds": ["document"]},
        "pagination": {"page": 2, "pageSize": 10},
    }
    assert search.headers["Content-Type"] == "application/json"
    assert (extract.method, extract.path, extract.query) == (
        "GET",
        f"{base}/v2/extract/{JOB_ID}",
        {"format": "markdown"},
    )
    assert extract.body == b""
    assert (link.path, link.query) == (
        f"{base}/v2/link",
        {"url": "https://example.com/a?b=1&c=2", "type": "link"},
    )
    assert list_logs.path == f"{base}/v2/extract/{JOB_ID}/webhook-logs"
    assert one_log.path == f"{base}/v2/extract/{JOB_ID}/webhook-logs/{LOG_ID}"
    for seen in server.seen:
        assert seen.headers["X-Api-Key"] == API_KEY
        assert seen.headers["X-Service-Base-Id"] == "base-7"
        assert seen.headers["Accept"] == "application/json"
        ua = seen.headers["User-Agent"]
        assert ua.startswith(f"asyncsearch/{asyncsearch.__version__} Python/3.")
        assert f"aiohttp/{aiohttp.__version__}" in ua


async def test_without_base_id_no_base_header_and_extra_headers_sent(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    async with make_client(server, headers={"X-Request-Source": "tests"}) as client:
        await client.get_extraction(JOB_ID)
    (seen,) = server.seen
    assert "X-Service-Base-Id" not in seen.headers
    assert seen.headers["X-Request-Source"] == "tests"
    assert seen.query == {}


async def test_with_raw_response_gives_status_headers_attempts(serve: Serve) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            return web.Response(status=503)
        return json_answer(sample("extraction_job.json"), **{"X-Request-Id": "req-1"})

    server = await serve(handler)
    async with make_client(server) as client:
        raw = await client.with_raw_response.get_extraction(JOB_ID)
    assert raw.status_code == 200
    assert raw.headers["x-request-id"] == "req-1"
    assert raw.attempts == 2
    assert raw.elapsed >= 0
    assert raw.content == sample("extraction_job.json")
    job = raw.parse()
    assert isinstance(job, asyncsearch.ExtractionJob)
    assert raw.parse() is job
    assert "attempts=2" in repr(raw)


async def test_raw_response_parse_error_carries_attempts(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return json_answer(b'{"total": "many", "hasMore": false}')

    server = await serve(handler)
    async with make_client(server) as client:
        raw = await client.with_raw_response.search("x")
        with pytest.raises(ResponseValidationError) as info:
            raw.parse()
    assert info.value.attempts == 1
    assert info.value.path == "$.total"


async def test_with_raw_response_takes_embeddings_and_drops_them(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return json_answer(sample("search_page.json"))

    server = await serve(handler)
    async with make_client(server) as client:
        raw = await client.with_raw_response.search("x", embeddings=False, page_size=2)
        assert isinstance(client.with_raw_response, asyncsearch.RawResponseClient)
    lean = raw.parse()
    assert type(lean) is asyncsearch.SearchPage
    assert lean.hits
    assert lean.hits[0].embeddings is None
    assert json.loads(server.seen[0].body)["pagination"] == {"pageSize": 2}


def test_raw_response_client_has_every_endpoint_with_the_same_signature() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")
    names = ("search", "get_extraction", "link_preview", "list_webhook_logs", "get_webhook_log")
    for name in names:
        plain_method = getattr(client, name)
        raw_method = getattr(client.with_raw_response, name)
        # One declaration: the same arguments and docstring; the raw one returns an APIResponse
        # of what the plain method returns.
        plain = inspect.signature(plain_method)
        raw = inspect.signature(raw_method)
        assert "self" not in plain.parameters, name
        assert raw.parameters == plain.parameters, name
        assert raw.return_annotation == f"APIResponse[{plain.return_annotation}]", name
        assert not plain.return_annotation.startswith("_"), name
        assert raw_method.__doc__ == plain_method.__doc__, name
        assert plain_method.__name__ == name
    expected = {"search": "SearchPage", "get_extraction": "ExtractionJob"}
    for name, model in expected.items():
        assert inspect.signature(getattr(client, name)).return_annotation == model


async def test_a_page_below_first_page_is_refused_before_sending(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return json_answer(sample("search_page.json"))

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(InvalidRequestError, match="page must be >= 1, the client's first_page"):
            await client.search("x", page=0)
        with pytest.raises(InvalidRequestError, match="page must be >= 1"):
            await client.with_raw_response.search("x", page=-3)
        with pytest.raises(InvalidRequestError, match="start_page must be >= 1"):
            client.search_hits("x", start_page=0)
        assert server.seen == []
        # No upper bound is invented: the spec fixes none.
        await client.search("x", page=10**6, page_size=10**6)
        async with make_client(server, first_page=0) as zero_based:
            await zero_based.search("x", page=0)
    assert [json.loads(r.body)["pagination"]["page"] for r in server.seen] == [10**6, 0]


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, asyncsearch.BadRequestError),
        (401, asyncsearch.AuthenticationError),
        (403, asyncsearch.PermissionDeniedError),
        (404, NotFoundError),
        (409, asyncsearch.ConflictError),
        (422, asyncsearch.UnprocessableEntityError),
    ],
)
async def test_final_statuses_are_sent_once(
    serve: Serve, status: int, cls: type[Exception]
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return json_answer(b'{"error": {"message": "nope"}}', status=status)

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(cls) as info:
            await client.get_extraction(JOB_ID)
    assert len(server.seen) == 1
    error = info.value
    assert isinstance(error, APIStatusError)
    assert error.status_code == status
    assert error.attempts == 1
    assert error.body == {"error": {"message": "nope"}}
    assert error.method == "GET"
    assert error.url.endswith(f"/v2/extract/{JOB_ID}")
    assert "nope" in str(error)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
async def test_retryable_statuses_then_success(
    serve: Serve, status: int, no_real_sleep: list[float]
) -> None:
    answers = [status, status, 200]

    async def handler(request: web.Request) -> web.StreamResponse:
        code = answers.pop(0)
        if code == 200:
            return json_answer(sample("extraction_job.json"))
        return web.Response(status=code)

    server = await serve(handler)
    async with make_client(server) as client:
        job = await client.get_extraction(JOB_ID)
    assert job.id == JOB_ID
    assert len(server.seen) == 3
    assert len(no_real_sleep) == 2
    # Full jitter: each delay is within its exponential ceiling.
    assert 0 <= no_real_sleep[0] <= 0.5
    assert 0 <= no_real_sleep[1] <= 1.0


async def test_persistent_503_says_how_many_attempts(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="down")

    server = await serve(handler)
    async with make_client(server, max_retries=3) as client:
        with pytest.raises(InternalServerError) as info:
            await client.search("x")
    assert len(server.seen) == 4
    assert info.value.attempts == 4
    assert "after 4 attempts" in str(info.value)


async def test_max_retries_zero_and_per_call_override(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        # 503, not 500: a search with history is retried only after answers that say it was
        # not acted on (see retry_search).
        return web.Response(status=503)

    server = await serve(handler)
    async with make_client(server, max_retries=0) as client:
        with pytest.raises(InternalServerError):
            await client.search("x")
        assert len(server.seen) == 1
        with pytest.raises(InternalServerError) as info:
            await client.with_options(max_retries=1).search("x")
    assert len(server.seen) == 3
    assert info.value.attempts == 2


async def test_retry_after_is_honoured(serve: Serve, no_real_sleep: list[float]) -> None:
    answers = [("429", {"Retry-After": "2"}), ("503", {"retry-after-ms": "1500"}), ("200", {})]

    async def handler(request: web.Request) -> web.StreamResponse:
        code, headers = answers.pop(0)
        if code == "200":
            return json_answer(sample("extraction_job.json"))
        return web.Response(status=int(code), headers=headers)

    server = await serve(handler)
    async with make_client(server) as client:
        await client.get_extraction(JOB_ID)
    assert no_real_sleep == [2.0, 1.5]


async def test_retry_after_above_max_is_raised_at_once(
    serve: Serve, no_real_sleep: list[float]
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=429, headers={"Retry-After": "120"})

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(RateLimitError) as info:
            await client.get_extraction(JOB_ID)
    assert info.value.retry_after == 120.0
    assert info.value.attempts == 1
    assert len(server.seen) == 1
    assert no_real_sleep == []


async def test_connection_refused_is_retried_then_raised(no_real_sleep: list[float]) -> None:
    # Bind and close a socket to get a port that nothing listens on.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AsyncSearchClient(API_KEY, base_url=f"http://127.0.0.1:{port}") as client:
        with pytest.raises(APIConnectionError) as info:
            await client.get_extraction(JOB_ID)
    assert not isinstance(info.value, APITimeoutError)
    assert info.value.attempts == 3
    assert len(no_real_sleep) == 2
    assert API_KEY not in repr(info.value.__cause__)


async def test_read_timeout_is_a_timeout_error(serve: Serve) -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    server = await serve(handler)
    try:
        async with make_client(server, timeout=Timeout(read=0.2), max_retries=1) as client:
            with pytest.raises(APITimeoutError) as info:
                await client.get_extraction(JOB_ID)
    finally:
        release.set()
    assert info.value.attempts == 2
    assert len(server.seen) == 2


async def test_total_timeout_as_a_number(serve: Serve) -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    server = await serve(handler)
    try:
        async with make_client(server, timeout=0.2, max_retries=0) as client:
            with pytest.raises(APITimeoutError):
                await client.search("x")
    finally:
        release.set()


def test_default_timeout_is_finite() -> None:
    default = Timeout()
    assert all(
        v is not None and 0 < v < 1000
        for v in (default.connect, default.read, default.total, default.pool)
    )
    assert Timeout.coerce(asyncsearch._config.NOT_GIVEN) == default
    assert Timeout.coerce(5) == Timeout(connect=5, read=5, total=5, pool=5)
    with pytest.raises(ConfigurationError):
        Timeout(read=-1)
    with pytest.raises(ConfigurationError):
        Timeout(total=float("inf"))
    with pytest.raises(ConfigurationError):
        Timeout(pool=0)


def test_timeout_none_turns_every_limit_off_and_not_given_keeps_the_default() -> None:
    off = Timeout(connect=None, read=None, total=None, pool=None)
    assert Timeout.coerce(None) == off
    assert make_client_options() == Timeout()
    assert make_client_options(timeout=None) == off
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", timeout=3)
    assert client.with_options(timeout=None)._options.timeout == off
    assert client.with_options(max_retries=0)._options.timeout == Timeout.coerce(3)
    # A Timeout keeps the per-phase limits the caller set, with no total.
    phases = Timeout(connect=2, read=4, total=None, pool=None)
    assert client.with_options(timeout=phases)._options.timeout == phases


def test_with_options_keeps_what_it_is_not_given_and_refuses_the_pool_s_options() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", base_id="b", max_retries=4)
    child = client.with_options(first_page=0)
    assert (child._options.base_id, child._options.retry.max_retries) == ("b", 4)
    assert child._options.first_page == 0
    assert client.with_options(base_id=None)._options.base_id is None
    with pytest.raises(TypeError, match="max_connections"):
        client.with_options(max_connections=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="max_retries"):
        client.with_options(max_retries=-1)


def make_client_options(**options: Any) -> Timeout:
    return AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", **options)._options.timeout


def test_the_cli_without_timeout_keeps_the_default_and_with_one_uses_it() -> None:
    from asyncsearch._cli import build_parser
    from asyncsearch._cli._run import Context, Runtime

    common = ["extract", JOB_ID, "--api-key", API_KEY, "--base-url", "http://127.0.0.1:9"]
    default = Context(build_parser().parse_args(common), Runtime({})).client()
    assert default._options.timeout == Timeout()
    given = Context(build_parser().parse_args([*common, "--timeout", "5"]), Runtime({})).client()
    assert given._options.timeout == Timeout.coerce(5.0)


@pytest.mark.parametrize(
    "body",
    [b"<html>hello</html>", b'{"total": 1, "hasMo', b'{"total": "x", "hasMore": false}', b""],
)
async def test_bad_success_bodies_raise_validation_error(serve: Serve, body: bytes) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=200, content_type="text/html")

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(ResponseValidationError) as info:
            await client.search("x")
    assert info.value.body == body
    assert info.value.attempts == 1
    assert len(server.seen) == 1


async def test_response_too_large_plain_and_gzip_bomb(serve: Serve) -> None:
    bomb = gzip.compress(b" " * (20 * 1024 * 1024))

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("search"):
            return web.Response(
                body=b"[" + b"1," * 600_000 + b"1]", content_type="application/json"
            )
        return web.Response(
            body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    server = await serve(handler)
    async with make_client(server, max_response_bytes=1024 * 1024) as client:
        with pytest.raises(ResponseTooLargeError) as info:
            await client.search("x")
        assert info.value.limit == 1024 * 1024
        with pytest.raises(ResponseTooLargeError):
            await client.get_extraction(JOB_ID)
    assert len(server.seen) == 2


@pytest.mark.parametrize("inflating_session", [False, True], ids=["sdk-session", "callers-session"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_compressed_bodies_are_decoded(
    serve: Serve, encoding: str, inflating_session: bool
) -> None:
    payload = sample("extraction_job.json")
    if encoding == "gzip":
        data = gzip.compress(payload)
    elif encoding == "deflate":
        data = zlib.compress(payload)
    else:
        compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        data = compressor.compress(payload) + compressor.flush()

    async def handler(request: web.Request) -> web.StreamResponse:
        assert "gzip" in request.headers["Accept-Encoding"]
        header = "deflate" if encoding == "raw-deflate" else encoding
        # web.Response sends a Content-Length: that of the compressed bytes.
        return web.Response(
            body=data, headers={"Content-Encoding": header, "Content-Type": "application/json"}
        )

    server = await serve(handler)
    async with contextlib.AsyncExitStack() as stack:
        options: dict[str, Any] = {}
        if inflating_session:
            # aiohttp's default, auto_decompress=True: the session inflates bodies itself.
            options["session"] = await stack.enter_async_context(aiohttp.ClientSession())
        client = await stack.enter_async_context(make_client(server, **options))
        job = await client.get_extraction(JOB_ID)
    assert job.id == JOB_ID


# -- redirects ------------------------------------------------------------------------------------


async def test_same_origin_redirect_is_followed_with_the_key(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/old"):
            raise web.HTTPTemporaryRedirect(request.path.replace("/old", "", 1))
        return json_answer(sample("search_page.json"))

    server = await serve(handler)
    async with make_client(server, "/old") as client:
        page = await client.search("x")
    assert page.total == 42
    first, second = server.seen
    assert (first.path, second.path) == ("/old/v2/search", "/v2/search")
    assert second.method == "POST"
    assert second.body == first.body
    assert second.headers["X-Api-Key"] == API_KEY


async def test_cross_origin_redirect_is_not_followed(serve: Serve) -> None:
    target = await serve(routes(SAMPLE_ROUTES))
    other_origin = target.base_url.replace("127.0.0.1", "localhost")

    async def handler(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(other_origin + request.path)

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(APIStatusError) as info:
            await client.get_extraction(JOB_ID)
    assert info.value.status_code == 302
    assert "not followed" in str(info.value)
    assert target.seen == []
    assert len(server.seen) == 1


async def test_redirect_loop_ends_with_a_clear_error(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(request.path)

    server = await serve(handler)
    async with make_client(server, max_redirects=3) as client:
        with pytest.raises(APIStatusError, match="more than 3 redirects") as info:
            await client.get_extraction(JOB_ID)
    assert len(server.seen) == 4
    assert info.value.status_code == 302


# -- options and lifecycle ------------------------------------------------------------------------


def test_missing_key_and_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCSEARCH_API_KEY", raising=False)
    monkeypatch.delenv("ASYNCSEARCH_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="ASYNCSEARCH_API_KEY"):
        AsyncSearchClient(base_url="https://api.example.com")
    with pytest.raises(ConfigurationError, match="ASYNCSEARCH_BASE_URL"):
        AsyncSearchClient("key")


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCSEARCH_API_KEY", API_KEY)
    monkeypatch.setenv("ASYNCSEARCH_BASE_URL", "https://api.example.com/prefix/")
    client = AsyncSearchClient()
    assert "https://api.example.com/prefix" in repr(client)
    assert API_KEY not in repr(client)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"base_url": "http://api.example.com"}, "plain http"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_response_bytes": 0}, "max_response_bytes"),
        ({"timeout": "soon"}, "timeout"),
        # The message names what was passed, not the Timeout field it would have become.
        ({"timeout": -1}, r"^timeout must be a positive finite number .* got -1$"),
        ({"timeout": 0}, r"^timeout must be a positive finite number .* got 0$"),
        ({"timeout": float("nan")}, r"^timeout must be a positive finite number .* got nan$"),
        ({"timeout": float("inf")}, r"^timeout must be a positive finite number .* got inf$"),
        ({"headers": {"X-A": "a\r\nX-B: b"}}, "line breaks"),
        ({"base_id": ""}, "base_id"),
        ({"ssl": True}, "ssl"),
        ({"retry_budget": 5}, "retry_budget"),
        ({"first_page": "1"}, "first_page"),
        ({"max_retry_after": -1}, "max_retry_after"),
        ({"retry_search": "never"}, "retry_search"),
        ({"retry_search": True}, "retry_search"),
        ({"retry_search": None}, "retry_search"),
    ],
)
def test_bad_options_raise_configuration_error(options: dict[str, Any], needle: str) -> None:
    kwargs: dict[str, Any] = {"base_url": "https://api.example.com", **options}
    with pytest.raises(ConfigurationError, match=needle):
        AsyncSearchClient(API_KEY, **kwargs)


def test_allow_http_for_remote_hosts() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://api.example.com", allow_http=True)
    assert "http://api.example.com" in repr(client)


def test_key_not_in_repr_or_vars() -> None:
    client = AsyncSearchClient(API_KEY, base_url="https://api.example.com")
    assert API_KEY not in repr(client)
    assert API_KEY not in str(client)
    assert API_KEY not in repr(vars(client))
    assert API_KEY not in repr(client.with_options(base_id="b"))


async def test_validation_happens_before_anything_is_sent(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    async with make_client(server) as client:
        with pytest.raises(InvalidRequestError):
            await client.search("x" * 256)
        with pytest.raises(InvalidRequestError):
            await client.get_extraction("../../etc/passwd")
        with pytest.raises(InvalidRequestError):
            await client.link_preview("")
    assert server.seen == []


async def test_closed_client_refuses_use(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    client = make_client(server)
    await client.get_extraction(JOB_ID)
    await client.aclose()
    await client.aclose()  # twice is fine
    assert client.is_closed
    with pytest.raises(ClientClosedError, match="closed"):
        await client.get_extraction(JOB_ID)
    with pytest.raises(ClientClosedError):
        client.with_options(max_retries=0)
    with pytest.raises(RuntimeError):
        await client.search("x")
    assert len(server.seen) == 1


async def test_with_options_shares_the_pool_and_closing_a_child_keeps_it(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    async with make_client(server) as parent:
        child = parent.with_options(base_id="b1", timeout=5, headers={"X-Child": "1"})
        assert child._shared is parent._shared
        await child.get_extraction(JOB_ID)
        await child.aclose()
        assert child.is_closed
        with pytest.raises(ClientClosedError):
            await child.get_extraction(JOB_ID)
        assert not parent.is_closed
        await parent.get_extraction(JOB_ID)
        cleared = parent.with_options(base_id="b2").with_options(base_id=None)
        await cleared.get_extraction(JOB_ID)
    assert child.is_closed
    assert parent.is_closed
    assert server.seen[0].headers["X-Service-Base-Id"] == "b1"
    assert server.seen[0].headers["X-Child"] == "1"
    assert "X-Service-Base-Id" not in server.seen[1].headers
    assert "X-Service-Base-Id" not in server.seen[2].headers


async def test_children_fail_once_the_parent_is_closed(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    parent = make_client(server)
    child = parent.with_options(max_retries=0)
    await parent.aclose()
    with pytest.raises(ClientClosedError):
        await child.get_extraction(JOB_ID)
    assert server.seen == []


async def test_the_session_the_client_created_is_closed_by_aclose(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    client = make_client(server)
    child = client.with_options(max_retries=0)
    await client.get_extraction(JOB_ID)
    session = client._shared.transport._session
    assert isinstance(session, aiohttp.ClientSession)
    connector = session.connector
    assert connector is not None
    await child.aclose()
    assert not session.closed  # a derived client shares the pool and does not own it
    await client.aclose()
    assert session.closed
    assert connector.closed


async def test_session_passed_in_is_used_and_not_closed(serve: Serve) -> None:
    server = await serve(routes(SAMPLE_ROUTES))
    async with aiohttp.ClientSession() as session:
        async with make_client(server, session=session) as client:
            job = await client.get_extraction(JOB_ID)
        assert job.id == JOB_ID
        assert not session.closed
    assert session.closed


async def test_closing_with_requests_in_flight(serve: Serve) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        started.set()
        await release.wait()
        return json_answer(sample("extraction_job.json"))

    server = await serve(handler)
    client = make_client(server)
    task = asyncio.create_task(client.get_extraction(JOB_ID))
    await started.wait()
    await client.aclose()
    with pytest.raises(ClientClosedError):
        await task
    release.set()


def test_use_from_another_event_loop_is_a_clear_error() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")

    async def first() -> None:
        with pytest.raises(APIConnectionError):
            await client.with_options(max_retries=0).get_extraction(JOB_ID)

    async def second() -> None:
        # Its class says what happened; it stays a ClientClosedError for existing handlers.
        with pytest.raises(EventLoopMismatchError, match="another event loop"):
            await client.get_extraction(JOB_ID)
        # Closing from here is refused too (the session's sockets belong to the first loop),
        # and it must not hang.
        with pytest.raises(EventLoopMismatchError, match="another event loop"):
            await client.aclose()
        assert issubclass(EventLoopMismatchError, ClientClosedError)
        assert not client.is_closed

    first_loop = asyncio.new_event_loop()
    try:
        first_loop.run_until_complete(first())
        result: list[BaseException] = []

        def run_second() -> None:
            try:
                asyncio.run(second())
            except BaseException as exc:  # pragma: no cover - reported below
                result.append(exc)

        thread = threading.Thread(target=run_second)
        thread.start()
        thread.join(10)
        assert result == []
        # The loop the client belongs to closes it, without warnings.
        first_loop.run_until_complete(client.aclose())
        assert client.is_closed
    finally:
        first_loop.close()


# -- logging ---------------------------------------------------------------------------------------


async def test_logs_one_debug_line_per_attempt_and_info_per_retry(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    answers = [503, 200]

    async def handler(request: web.Request) -> web.StreamResponse:
        code = answers.pop(0)
        if code == 200:
            return json_answer(sample("extraction_job.json"))
        return web.Response(status=code, text=f"error mentioning {API_KEY}")

    server = await serve(handler)
    async with make_client(server) as client:
        await client.get_extraction(JOB_ID)
    records = [r for r in caplog.records if r.name == "asyncsearch"]
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(debug) == 2
    assert f"GET /v2/extract/{JOB_ID} -> 503 (attempt 1" in debug[0]
    assert f"GET /v2/extract/{JOB_ID} -> 200 (attempt 2" in debug[1]
    assert len(info) == 1
    assert "retrying GET" in info[0]
    assert "status 503" in info[0]
    for record in records:
        assert API_KEY not in record.getMessage()
        assert "error mentioning" not in record.getMessage()  # never a body


async def test_key_is_in_no_exception_text_or_cause(serve: Serve) -> None:
    import traceback

    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("search"):
            return web.Response(status=401, text=f"bad key {API_KEY}")
        if "webhook-logs" in request.path:
            await release.wait()
        if request.path.endswith("link"):
            # A malformed response: aiohttp raises an error that carries request info.
            return web.Response(status=200, headers={"Content-Length": "100"}, body=b"{}")
        return web.json_response({"id": 7})

    server = await serve(handler)
    errors: list[BaseException] = []
    async with make_client(server, max_retries=0, timeout=Timeout(read=0.2)) as client:
        for call in (
            client.search("x"),
            client.get_extraction(JOB_ID),
            client.list_webhook_logs(JOB_ID),
            client.link_preview("https://example.com"),
        ):
            with pytest.raises(asyncsearch.AsyncSearchError) as info:
                await call
            errors.append(info.value)
    release.set()
    assert {type(e) for e in errors} >= {
        asyncsearch.AuthenticationError,
        ResponseValidationError,
        APITimeoutError,
    }
    for error in errors:
        chain: list[BaseException] = []
        current: BaseException | None = error
        while current is not None:
            chain.append(current)
            current = current.__cause__ or current.__context__
        text = "".join(traceback.format_exception(error))
        for item in chain:
            text += str(item) + repr(item) + repr(vars(item))
        assert API_KEY not in text


async def test_aiohttp_request_info_inside_wrapped_errors_is_scrubbed() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0
        ) as client:
            with pytest.raises(APIConnectionError, match="malformed") as info:
                await client.get_extraction(JOB_ID)
    finally:
        server.close()
        await server.wait_closed()
    cause = info.value.__cause__
    assert isinstance(cause, aiohttp.ClientResponseError)
    assert cause.request_info.headers["X-Api-Key"] == "[redacted]"
    assert API_KEY not in repr(cause)


@pytest.mark.parametrize("compressed", [False, True])
async def test_a_huge_error_body_is_cut_and_the_status_still_decides(
    serve: Serve, compressed: bool
) -> None:
    page = b"<html>" + b"Service Unavailable " * 200_000 + b"</html>"

    async def handler(request: web.Request) -> web.StreamResponse:
        if compressed:
            return web.Response(
                status=503, body=gzip.compress(page), headers={"Content-Encoding": "gzip"}
            )
        return web.Response(status=503, body=page, content_type="text/html")

    server = await serve(handler)
    async with make_client(server, max_response_bytes=1024 * 1024) as client:
        with pytest.raises(InternalServerError) as info:
            await client.get_extraction(JOB_ID)
    assert info.value.attempts == 3
    assert len(server.seen) == 3
    assert isinstance(info.value.body, str)
    assert info.value.body.startswith("<html>Service Unavailable")
    assert len(info.value.body) <= 4096


@pytest.mark.parametrize("inflating_session", [False, True], ids=["sdk-session", "callers-session"])
async def test_size_cap_counts_inflated_bytes_with_either_session(
    serve: Serve, inflating_session: bool
) -> None:
    """The cap is on the inflated body: a gzip body with a (compressed) Content-Length far below
    the cap passes up to the cap's last byte and fails one byte past it, and a bomb fails."""
    limit = 1024 * 1024
    bodies = {
        "at-cap": gzip.compress(b" " * limit),
        "past-cap": gzip.compress(b" " * (limit + 1)),
        "bomb": gzip.compress(b" " * (64 * limit)),
    }
    assert all(len(body) < limit // 10 for body in bodies.values())

    async def handler(request: web.Request) -> web.StreamResponse:
        kind = request.query["url"].rsplit("/", 1)[1]
        return web.Response(
            body=bodies[kind],
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    server = await serve(handler)
    async with contextlib.AsyncExitStack() as stack:
        options: dict[str, Any] = {}
        if inflating_session:
            # aiohttp's default, auto_decompress=True: the session inflates bodies itself.
            options["session"] = await stack.enter_async_context(aiohttp.ClientSession())
        client = await stack.enter_async_context(
            make_client(server, max_response_bytes=limit, max_retries=0, **options)
        )
        at_cap = await client.with_raw_response.link_preview("https://example.com/at-cap")
        assert at_cap.content == b" " * limit
        for kind in ("past-cap", "bomb"):
            with pytest.raises(ResponseTooLargeError) as info:
                await client.with_raw_response.link_preview(f"https://example.com/{kind}")
            assert info.value.limit == limit
    assert len(server.seen) == 3


async def test_an_html_page_answered_with_200_says_what_came_instead(serve: Serve) -> None:
    """Issue 47: "the response body is not valid JSON" alone did not say a login page came
    (a wrong base_url, a proxy's portal); now the status, type, URL and the body's start, the
    key scrubbed from it (a debug page may echo the request's headers)."""

    async def portal(request: web.Request) -> web.StreamResponse:
        page = f"<html><body>Sign in. You sent {request.headers['X-Api-Key']}</body></html>"
        return web.Response(text=page, content_type="text/html")

    server = await serve(portal)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(asyncsearch.ResponseValidationError) as caught:
            await client.get_extraction(JOB_ID)
    message = str(caught.value)
    assert message.startswith(f"the 200 answer of {server.base_url}/v2/extract/{JOB_ID}")
    assert "(text/html; charset=utf-8)" in message
    assert "it starts with '<html><body>Sign in. You sent [redacted]" in message
    assert API_KEY not in message
    assert API_KEY not in repr(caught.value.body)
