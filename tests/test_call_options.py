"""Per-call options (``RequestOptions``) on every method family; request ids; ASYNCSEARCH_LOG."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from asyncsearch import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchClient,
    ConfigurationError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    ResponseValidationError,
    Timeout,
    _call,
)

from .conftest import API_KEY, JOB_ID, LOG_ID, Handler, Server
from .faults_helpers import http_response, raw_server
from .helpers import TIME_SCALE

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(30)

SAMPLES = Path(__file__).parent / "samples"
OTHER_JOB = "0b2e4c6a-1d3f-4a5b-8c7d-0e1f2a3b4c5d"


def _sample(name: str, **changes: object) -> bytes:
    data = json.loads((SAMPLES / name).read_bytes())
    data.update(changes)
    return json.dumps(data).encode()


ANSWERS = {
    "search": _sample("search_page.json", hasMore=False),
    "link": _sample("link_preview.json"),
    "webhook_log": _sample("webhook_log.json"),
    "webhook_logs": _sample("webhook_logs.json"),
    # A state the spec does not name: wait_for_extraction returns at once.
    "extract": _sample("extraction_job.json", state="completed"),
}


def _kind(path: str) -> str:
    if path.endswith("/v2/search"):
        return "search"
    if path.endswith("/v2/link"):
        return "link"
    if "/webhook-logs/" in path:
        return "webhook_log"
    if path.endswith("/webhook-logs"):
        return "webhook_logs"
    return "extract"


def service(
    mode: str = "ok", *, request_id: str = "req-42", gate: asyncio.Event | None = None
) -> Handler:
    """Every endpoint; ``mode``: "ok", "503" (always) or "hang" (no answer until ``gate``)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if mode == "hang":
            assert gate is not None
            await gate.wait()
        headers = {"X-Request-Id": request_id}
        if mode == "503":
            return web.json_response({"message": "busy"}, status=503, headers=headers)
        return web.Response(
            body=ANSWERS[_kind(request.path)], content_type="application/json", headers=headers
        )

    return handler


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)


async def _first_error(results: list[Any]) -> None:
    for result in results:
        if result.error is not None:
            raise result.error


#: The ids of the bulk calls.
BULK_IDS = [JOB_ID, OTHER_JOB]


async def _gather(client: AsyncSearchClient, **options: Any) -> None:
    await _first_error(await client.gather_extractions(BULK_IDS, **options))


async def _iter(client: AsyncSearchClient, **options: Any) -> None:
    async with client.iter_extractions(BULK_IDS, **options) as results:
        await _first_error([result async for result in results])


async def _pages(client: AsyncSearchClient, **options: Any) -> None:
    async with client.search_pages("q", **options) as pages:
        assert [page async for page in pages]


async def _hits(client: AsyncSearchClient, **options: Any) -> None:
    async with client.search_hits("q", **options) as hits:
        assert [hit async for hit in hits]


Call = Callable[..., Coroutine[Any, Any, Any]]

#: Every method family, called with the given options.
FAMILIES: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
    "search": lambda c, **o: c.search("q", **o),
    "raw.search": lambda c, **o: c.with_raw_response.search("q", **o),
    "get_extraction": lambda c, **o: c.get_extraction(JOB_ID, **o),
    "raw.get_extraction": lambda c, **o: c.with_raw_response.get_extraction(JOB_ID, **o),
    "link_preview": lambda c, **o: c.link_preview("https://example.com/a b", **o),
    "raw.link_preview": lambda c, **o: c.with_raw_response.link_preview("https://x.test/", **o),
    "list_webhook_logs": lambda c, **o: c.list_webhook_logs(JOB_ID, **o),
    "raw.list_webhook_logs": lambda c, **o: c.with_raw_response.list_webhook_logs(JOB_ID, **o),
    "get_webhook_log": lambda c, **o: c.get_webhook_log(JOB_ID, LOG_ID, **o),
    "raw.get_webhook_log": lambda c, **o: c.with_raw_response.get_webhook_log(JOB_ID, LOG_ID, **o),
    "wait_for_extraction": lambda c, **o: c.wait_for_extraction(JOB_ID, **o),
    "search_pages": _pages,
    "search_hits": _hits,
    "gather_extractions": _gather,
    "iter_extractions": _iter,
}
SEARCHES = ["search", "raw.search", "search_pages", "search_hits"]
PAGERS = ["search_pages", "search_hits"]


def make_client(server: Server, **options: Any) -> AsyncSearchClient:
    return AsyncSearchClient(API_KEY, base_url=server.base_url, **options)


@pytest.mark.parametrize("family", FAMILIES)
async def test_extra_headers_and_query_reach_every_request_of_the_call_only(
    serve: Serve, family: str
) -> None:
    server = await serve(service())
    async with make_client(server, headers={"X-Client": "c", "X-Both": "client"}) as client:
        await FAMILIES[family](
            client,
            extra_headers={"X-Call": "yes", "X-Both": "call"},
            extra_query={"trace": 1, "flag": True, "note": "a b&c"},
        )
        called = len(server.seen)
        await FAMILIES[family](client)  # the next call has none of them
    assert called >= 1
    for seen in server.seen[:called]:
        assert seen.headers["X-Call"] == "yes"
        assert seen.headers["X-Both"] == "call"
        assert seen.headers["X-Client"] == "c"
        assert seen.headers["X-Api-Key"] == API_KEY
        assert {k: seen.query[k] for k in ("trace", "flag", "note")} == {
            "trace": "1",
            "flag": "true",
            "note": "a b&c",
        }
    for seen in server.seen[called:]:
        assert "X-Call" not in seen.headers
        assert seen.headers["X-Both"] == "client"
        assert "trace" not in seen.query


async def test_extra_query_replaces_a_parameter_the_sdk_sends(serve: Serve) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        await client.get_extraction(JOB_ID, format="json", extra_query={"format": "html"})
        await client.link_preview("https://x.test/", type="cache", extra_query={"type": "new"})
    extract, link = server.seen
    assert extract.query == {"format": "html"}
    assert link.query == {"url": "https://x.test/", "type": "new"}


@pytest.mark.parametrize("family", SEARCHES)
async def test_extra_body_is_merged_into_every_search_body(serve: Serve, family: str) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        await FAMILIES[family](
            client, incognito=False, extra_body={"futureField": {"a": [1, 2]}, "incognito": True}
        )
    assert server.seen
    for seen in server.seen:
        body = json.loads(seen.body)
        assert body["text"] == "q"
        assert body["futureField"] == {"a": [1, 2]}
        assert body["incognito"] is True  # the extra field replaces the SDK's


@pytest.mark.parametrize("family", SEARCHES)
@pytest.mark.parametrize(
    ("extra_body", "words"),
    [
        ({"pagination": {"page": 1, "pageSize": 0}}, "page_size must be at least 1"),
        ({"pagination": "all"}, "pagination must be an object"),
        ({"text": "x" * 256}, "text is 256 characters long"),
        ({"precision": 2}, "precision must be a number from 0 to 1"),
        ({"incognito": "yes"}, "incognito must be a bool"),
        ({"resourceId": "not-a-uuid"}, "resource_id"),
    ],
)
async def test_extra_body_cannot_bypass_the_checks_of_the_arguments(
    serve: Serve, family: str, extra_body: dict[str, Any], words: str
) -> None:
    # Issue 27: the merged body as sent passes the checks an argument would; nothing is sent.
    server = await serve(service())
    async with make_client(server) as client:
        with pytest.raises(InvalidRequestError, match="extra_body") as caught:
            await FAMILIES[family](client, extra_body=extra_body)
    if "pagination" in extra_body and family in PAGERS:
        words = f"cannot set pagination on {family}()"
    assert words in str(caught.value)
    assert server.seen == []


@pytest.mark.parametrize("family", PAGERS)
async def test_a_pager_refuses_extra_body_pagination(serve: Serve, family: str) -> None:
    # Issue 27: extra_body={"pagination": ...} replaced paging on every page of a walk (which
    # then stopped after one page). The pager numbers its pages itself.
    server = await serve(service())
    async with make_client(server) as client:
        with pytest.raises(InvalidRequestError, match="cannot set pagination on search_"):
            await FAMILIES[family](client, extra_body={"pagination": {"page": 3}})
        await client.search("q", extra_body={"pagination": {"page": 3, "pageSize": 5}})
    (seen,) = server.seen  # only the plain search, which may set its own page
    assert json.loads(seen.body)["pagination"] == {"page": 3, "pageSize": 5}


@pytest.mark.parametrize("family", FAMILIES)
async def test_max_retries_per_call_overrides_the_client(serve: Serve, family: str) -> None:
    server = await serve(service("503"))
    # A bulk call fetches each of its ids; any other call stops at its first failure.
    units = len(BULK_IDS) if family.endswith("_extractions") else 1
    async with make_client(server, max_retries=2) as client:
        with pytest.raises(InternalServerError):
            await FAMILIES[family](client, max_retries=0)
        first = len(server.seen)
    async with make_client(server, max_retries=0) as client:
        with pytest.raises(InternalServerError):
            await FAMILIES[family](client, max_retries=3)
    assert first == units * 1
    assert len(server.seen) - first == units * 4


@pytest.mark.parametrize("family", FAMILIES)
async def test_timeout_per_call_bounds_each_attempt(serve: Serve, family: str) -> None:
    gate = asyncio.Event()
    server = await serve(service("hang", gate=gate))
    try:
        async with make_client(server, timeout=Timeout(read=60 * TIME_SCALE)) as client:
            with pytest.raises(APITimeoutError):
                await FAMILIES[family](client, timeout=Timeout(read=0.2), max_retries=0)
    finally:
        gate.set()


async def test_a_looser_timeout_per_call_outlasts_the_clients(serve: Serve) -> None:
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await gate.wait()
        return web.Response(body=ANSWERS["extract"], content_type="application/json")

    server = await serve(slow)
    async with make_client(server, timeout=0.2, max_retries=0) as client:
        with pytest.raises(APITimeoutError):
            await client.get_extraction(JOB_ID)
        call = asyncio.create_task(client.get_extraction(JOB_ID, timeout=None))
        # Held past the client's 0.2 s: with the client's timeout the call would fail by then.
        await asyncio.sleep(0.5)
        gate.set()
        assert (await call).id == JOB_ID


async def test_wait_for_extraction_max_wait_is_the_whole_wait(serve: Serve) -> None:
    pending = _sample("extraction_job.json")

    async def always_pending(request: web.Request) -> web.StreamResponse:
        return web.Response(body=pending, content_type="application/json")

    server = await serve(always_pending)
    async with make_client(server) as client:
        with pytest.raises(TimeoutError) as caught:
            await client.wait_for_extraction(JOB_ID, interval=0.01, max_wait=0.3)
    assert "after 0.3s" in str(caught.value)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"timeout": -1}, InvalidRequestError, "Timeout"),
        ({"timeout": "soon"}, InvalidRequestError, "timeout"),
        ({"max_retries": -1}, InvalidRequestError, "max_retries"),
        ({"max_retries": True}, InvalidRequestError, "max_retries"),
        ({"extra_headers": {"X-Bad": "a\r\nb"}}, InvalidRequestError, "line breaks"),
        ({"extra_headers": ["X-A"]}, InvalidRequestError, "mapping"),
        ({"extra_query": {"a": [1]}}, InvalidRequestError, "str, int, float or bool"),
        ({"extra_query": {"": 1}}, InvalidRequestError, "parameter name"),
        ({"extra_body": {"a": 1}}, TypeError, "unexpected keyword argument 'extra_body'"),
        ({"max_retry": 1}, TypeError, "unexpected keyword argument 'max_retry'"),
    ],
)
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in SEARCHES])
async def test_bad_options_are_refused_before_anything_is_sent(
    serve: Serve, family: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        with pytest.raises(error, match=match):
            await FAMILIES[family](client, **options)
    assert server.seen == []


@pytest.mark.parametrize("family", SEARCHES)
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"extra_body": {"a": object()}}, "cannot be sent as JSON"),
        ({"extra_body": {1: "a"}}, "not a field name"),
        ({"extra_body": "text"}, "mapping"),
        ({"extra_query": {"a": None}}, "str, int, float or bool"),
    ],
)
async def test_bad_search_options_are_refused_before_anything_is_sent(
    serve: Serve, family: str, options: dict[str, Any], match: str
) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        with pytest.raises(InvalidRequestError, match=match):
            await FAMILIES[family](client, **options)
    assert server.seen == []


# -- request ids -----------------------------------------------------------------------------


async def test_request_id_of_an_answer(serve: Serve) -> None:
    server = await serve(service(request_id="abc-123"))
    async with make_client(server) as client:
        response = await client.with_raw_response.get_extraction(JOB_ID)
    assert response.request_id == "abc-123"


async def test_request_id_on_the_model_of_a_plain_call_and_never_on_the_wire(
    serve: Serve,
) -> None:
    """Issue 38: the id without with_raw_response, as an attribute that is not a field."""
    server = await serve(service(request_id="rid-9"))
    async with make_client(server) as client:
        page = await client.search("q")
        job = await client.get_extraction(JOB_ID)
        log = await client.get_webhook_log(JOB_ID, LOG_ID)
        preview = await client.link_preview("https://example.com/a")
        results = await client.gather_extractions([JOB_ID])
        async with client.search_pages("q", max_pages=1) as pages:
            walked = [one async for one in pages]
        raw = await client.with_raw_response.get_extraction(JOB_ID)
    bulk_job = results[0].job
    assert bulk_job is not None
    models = [page, job, log, preview, bulk_job, walked[0], raw.parse()]
    for model in models:
        assert model.request_id == "rid-9", type(model).__name__
        for encoded in (model.to_json(), msgspec.json.encode(model), repr(model).encode()):
            assert b"rid-9" not in encoded
            assert b"equest_id" not in encoded
        assert "rid-9" not in str(model.to_dict())
        assert "rid-9" not in str(msgspec.to_builtins(model))
        # Not a field: a copy decoded from the wire form is equal, and has no id of its own.
        copy = msgspec.json.decode(model.to_json(), type=type(model))
        assert copy == model
        assert copy.request_id is None
    # Only the top-level object carries it.
    assert not hasattr(page.hits[0], "request_id")


async def test_request_id_falls_back_to_request_id_header_and_may_be_absent(serve: Serve) -> None:
    answers = iter([{"Request-Id": "plain-7"}, {}])

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=ANSWERS["extract"], content_type="application/json", headers=next(answers)
        )

    server = await serve(handler)
    async with make_client(server) as client:
        assert (await client.with_raw_response.get_extraction(JOB_ID)).request_id == "plain-7"
        assert (await client.with_raw_response.get_extraction(JOB_ID)).request_id is None


@pytest.mark.parametrize("x_first", [True, False])
async def test_x_request_id_wins_over_request_id_when_both_are_sent(
    serve: Serve, x_first: bool
) -> None:
    """Both headers on one answer, in either order: the id is X-Request-Id's, on an answer and
    on a status error alike."""
    both = [("X-Request-Id", "x-rid"), ("Request-Id", "plain-rid")]
    headers = dict(both if x_first else both[::-1])
    statuses = iter([200, 404])

    async def handler(request: web.Request) -> web.StreamResponse:
        status = next(statuses)
        body = ANSWERS["extract"] if status == 200 else b'{"message": "no such job"}'
        return web.Response(
            body=body, status=status, content_type="application/json", headers=headers
        )

    server = await serve(handler)
    async with make_client(server) as client:
        response = await client.with_raw_response.get_extraction(JOB_ID)
        with pytest.raises(NotFoundError) as caught:
            await client.get_extraction(JOB_ID)
    assert response.headers["Request-Id"] == "plain-rid"  # both reached the client
    assert response.request_id == "x-rid"
    assert caught.value.request_id == "x-rid"


async def test_request_id_on_status_errors_and_in_their_message(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"message": "no such job"}, status=404, headers={"X-Request-Id": "rid-404"}
        )

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(NotFoundError) as caught:
            await client.get_extraction(JOB_ID)
        (result,) = await client.gather_extractions([JOB_ID])
    assert caught.value.request_id == "rid-404"
    assert "rid-404" in str(caught.value)
    assert result.error is not None
    assert result.error.request_id == "rid-404"


async def test_request_id_on_a_body_that_does_not_fit(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"id": 7}, headers={"X-Request-Id": "rid-bad"})

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(ResponseValidationError) as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.request_id == "rid-bad"
    assert "rid-bad" in str(caught.value)


async def test_request_id_on_a_body_too_large() -> None:
    body = b"x" * 2048
    answer = http_response(200, body, headers={"X-Request-Id": "rid-big"})

    async def respond(request: Any, conn: Any) -> bool:
        conn.writer.write(answer)
        await conn.writer.drain()
        return True

    async with (
        raw_server(respond) as server,
        AsyncSearchClient(API_KEY, base_url=server.base_url, max_response_bytes=1024) as client,
    ):
        with pytest.raises(Exception) as caught:
            await client.get_extraction(JOB_ID)
    assert type(caught.value).__name__ == "ResponseTooLargeError"
    assert caught.value.request_id == "rid-big"  # type: ignore[attr-defined]


async def test_no_request_id_without_an_answer() -> None:
    async def close_at_once(request: Any, conn: Any) -> bool:
        return False

    async with (
        raw_server(close_at_once) as server,
        AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=0) as client,
    ):
        with pytest.raises(APIConnectionError) as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.request_id is None
    assert "request id" not in str(caught.value)


# -- ASYNCSEARCH_LOG -------------------------------------------------------------------------

_SHOW_LOGGING = (
    "import logging, asyncsearch; log = logging.getLogger('asyncsearch'); "
    "print(log.level, len(log.handlers)); log.debug('debug line'); log.info('info line')"
)


def _show_logging(value: str) -> subprocess.CompletedProcess[str]:
    """Import asyncsearch with ``ASYNCSEARCH_LOG=value``: its logger's level and handlers."""
    return subprocess.run(
        [sys.executable, "-c", _SHOW_LOGGING],
        env={**os.environ, "ASYNCSEARCH_LOG": value},
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
        check=True,
    )


@pytest.mark.parametrize(
    ("value", "level", "handlers", "shown"),
    [
        ("debug", 10, 1, ["debug line", "info line"]),
        ("INFO", 20, 1, ["info line"]),
        # The standard level names, as logging spells them (issue 27: "warning" was refused).
        ("warning", 30, 1, []),
        ("Error", 40, 1, []),
        ("critical", 50, 1, []),
        ("", 0, 0, []),
    ],
)
def test_asyncsearch_log_configures_the_logger(
    value: str, level: int, handlers: int, shown: list[str]
) -> None:
    done = _show_logging(value)
    assert done.stdout.split() == [str(level), str(handlers)]
    assert [line for line in ("debug line", "info line") if line in done.stderr] == shown


def test_an_unknown_asyncsearch_log_value_is_said_not_ignored() -> None:
    done = _show_logging("verbose")
    assert done.stdout.split() == ["0", "0"]
    assert "ASYNCSEARCH_LOG='verbose' is not a level name" in done.stderr
    assert "debug, error, fatal, info, warn, warning" in done.stderr


# -- one options type --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("timeout", -1),
        ("timeout", "soon"),
        ("max_retries", -1),
        ("max_retries", True),
        ("headers", {"X-Bad": "a\r\nb"}),
        ("headers", {"X-Api-Key": "other"}),
        ("headers", ["X-A"]),
    ],
)
async def test_an_option_is_checked_in_one_place_for_a_client_and_a_call(
    name: str, value: object
) -> None:
    """The constructor, ``with_options`` and one call refuse a value with the same words."""
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")
    with pytest.raises(ConfigurationError) as made:
        AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", **{name: value})
    with pytest.raises(ConfigurationError) as changed:
        client.with_options(**{name: value})
    call_name = "extra_headers" if name == "headers" else name
    with pytest.raises(InvalidRequestError) as called:
        await client.get_extraction(JOB_ID, **{call_name: value})
    await client.aclose()
    message = str(made.value)
    assert str(changed.value) == message
    # A call names its own keyword; the rest of the message is the same.
    assert str(called.value).replace("extra_headers", "headers").replace(", or None", "") == (
        message.replace(", or None", "")
    )


async def test_a_header_of_none_removes_only_in_with_options() -> None:
    """None removes a header the client has, in ``with_options``; where there is nothing to
    remove (the constructor, a header the client does not have, a call's ``extra_headers``,
    which only add) it is a bad value, refused before anything is sent. The rule follows the
    change, not the caller: there is no branch on who merges."""
    with pytest.raises(ConfigurationError, match="X-A"):
        AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", headers={"X-A": None})  # type: ignore[dict-item]
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", headers={"X-A": "1"})
    assert dict(client.with_options(headers={"x-a": None})._options.headers) == {}
    with pytest.raises(ConfigurationError, match="X-B"):
        client.with_options(headers={"X-B": None})  # a header it does not have
    with pytest.raises(InvalidRequestError, match="X-A"):
        await client.get_extraction(JOB_ID, extra_headers={"X-A": None})  # type: ignore[dict-item]
    await client.aclose()
