"""OpenTelemetry spans, recorded by the SDK's in-memory exporter from the global tracer provider."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl

import pytest
from aiohttp import web

pytest.importorskip(
    "opentelemetry.sdk", reason="the tracing tests need the OpenTelemetry SDK (in the test extra)"
)

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from asyncsearch import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchClient,
    NotFoundError,
    ResponseValidationError,
    SearchClient,
    Timeout,
    _call,
)
from asyncsearch._cli._run import CommandError
from asyncsearch._tracing import CallSpan, Tracing, error_type, redact_query

from .conftest import API_KEY, JOB_ID, LOG_ID, Handler, Server
from .faults_helpers import Conn, RawRequest, raw_server, stall
from .helpers import TIME_SCALE, ThreadedServer
from .test_call_options import ANSWERS, _kind

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(30)

QUERY = "confidential merger plans"
IDS = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 6)]

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> None:
    """The process's global tracer provider, set once (OpenTelemetry allows no second one)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    if not getattr(provider, "_asyncsearch_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._asyncsearch_test_exporter = True  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[Callable[[], list[ReadableSpan]]]:
    """The spans ended during the test, oldest first."""
    _EXPORTER.clear()
    yield lambda: list(_EXPORTER.get_finished_spans())
    _EXPORTER.clear()


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)


@pytest.fixture(autouse=True)
def spans_never_touched_after_end(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test fails if the SDK complains of a span set, evented or ended after its end."""
    caplog.set_level(logging.WARNING, logger="opentelemetry")
    yield
    complaints = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("opentelemetry") and "ended span" in r.getMessage()
    ]
    assert complaints == []


def service(*, statuses: list[int] | None = None, pages: int = 1) -> Handler:
    """Every endpoint; answers ``statuses`` in turn first (then 200); search has ``pages``."""
    queue = list(statuses or [])

    async def handler(request: web.Request) -> web.StreamResponse:
        if queue:
            status = queue.pop(0)
            if status != 200:
                return web.json_response({"message": "no"}, status=status)
        headers = {"X-Request-Id": "rid-1"}
        kind = _kind(request.path)
        if kind == "search":
            page = json.loads(await request.read()).get("pagination", {}).get("page", 1)
            body = json.loads(ANSWERS["search"])
            body["hasMore"] = page < pages
            for hit in body["hits"]:  # pages that differ: a repeated page ends a walk
                hit["id"] = f"{hit['id']}-{page}"
            return web.json_response(body, headers=headers)
        return web.Response(body=ANSWERS[kind], content_type="application/json", headers=headers)

    return handler


def make_client(server: Server, **options: Any) -> AsyncSearchClient:
    return AsyncSearchClient(API_KEY, base_url=server.base_url, **options)


def _texts(span: ReadableSpan) -> list[str]:
    values: list[Any] = list((span.attributes or {}).values())
    for event in span.events:
        values += list((event.attributes or {}).values())
    values.append(span.status.description or "")
    return [str(value) for value in values] + [span.name]


METHODS: dict[str, Callable[[AsyncSearchClient], Awaitable[Any]]] = {
    "search": lambda c: c.search(QUERY),
    "get_extraction": lambda c: c.get_extraction(JOB_ID),
    "link_preview": lambda c: c.link_preview("https://example.com/secret-page"),
    "list_webhook_logs": lambda c: c.list_webhook_logs(JOB_ID),
    "get_webhook_log": lambda c: c.get_webhook_log(JOB_ID, LOG_ID),
}


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("method", METHODS)
async def test_each_call_makes_one_client_span_named_for_its_method(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], method: str, raw: bool
) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        await METHODS[method](client.with_raw_response if raw else client)  # type: ignore[arg-type]
    (span,) = spans()
    assert span.name == f"asyncsearch.{method}"
    assert span.kind is SpanKind.CLIENT
    attributes = span.attributes or {}
    assert attributes["http.request.method"] == ("POST" if method == "search" else "GET")
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == int(server.base_url.rsplit(":", 1)[1])
    url, _, query = str(attributes["url.full"]).partition("?")
    assert url.startswith(server.base_url + "/v2/")
    # The query's names stay; its values may hold what the caller sent.
    assert all(value == "REDACTED" for _, value in parse_qsl(query, keep_blank_values=True))
    if method == "link_preview":
        assert query == "url=REDACTED"
    assert attributes["http.response.status_code"] == 200
    assert attributes["asyncsearch.attempts"] == 1
    assert attributes["asyncsearch.request_id"] == "rid-1"
    assert span.status.status_code is StatusCode.UNSET
    texts = _texts(span)
    assert not [t for t in texts if API_KEY in t or QUERY in t or "secret-page" in t]


@pytest.mark.parametrize("raw", [False, True])
async def test_a_search_span_has_its_page_and_hit_count(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], raw: bool
) -> None:
    server = await serve(service())
    async with make_client(server) as client:
        if raw:
            response = await client.with_raw_response.search(QUERY, page=3)
            hits = len(json.loads(response.content)["hits"])
        else:
            hits = len((await client.search(QUERY, page=3)).hits)
    (span,) = spans()
    assert (span.attributes or {})["asyncsearch.search.page"] == 3
    assert (span.attributes or {})["asyncsearch.search.hits"] == hits > 0


async def test_a_raw_search_whose_body_does_not_decode_still_answers(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"hits": "not a list"})

    server = await serve(handler)
    async with make_client(server) as client:
        response = await client.with_raw_response.search(QUERY, page=2)
    assert response.status_code == 200
    (span,) = spans()
    assert (span.attributes or {})["asyncsearch.search.page"] == 2
    assert "asyncsearch.search.hits" not in (span.attributes or {})
    assert span.status.status_code is StatusCode.UNSET


async def test_retries_are_events_and_attempts_are_counted(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    server = await serve(service(statuses=[503, 200]))
    async with make_client(server) as client:
        await client.get_extraction(JOB_ID)
    (span,) = spans()
    assert (span.attributes or {})["asyncsearch.attempts"] == 2
    (retry,) = span.events
    assert retry.name == "asyncsearch.retry"
    assert (retry.attributes or {})["asyncsearch.retry.reason"] == "status 503"
    assert (retry.attributes or {})["asyncsearch.attempt"] == 1
    assert span.status.status_code is StatusCode.UNSET


async def test_a_failed_call_records_its_error_type_and_status(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    server = await serve(service(statuses=[404]))
    async with make_client(server) as client:
        with pytest.raises(NotFoundError):
            await client.get_extraction(JOB_ID)
    (span,) = spans()
    assert (span.attributes or {})["error.type"] == "404"  # the conventions' value: the status
    assert (span.attributes or {})["http.response.status_code"] == 404
    assert span.status.status_code is StatusCode.ERROR


async def _close_at_once(request: RawRequest, conn: Conn) -> bool:
    return False  # the connection closes with no answer


@pytest.mark.parametrize(
    ("script", "error"), [(_close_at_once, APIConnectionError), (stall, APITimeoutError)]
)
async def test_a_call_failing_without_an_answer_ends_its_span_in_error(
    spans: Callable[[], list[ReadableSpan]],
    script: Callable[[RawRequest, Conn], Awaitable[bool]],
    error: type[Exception],
) -> None:
    """A connection error or a timeout, retried once and failing again: ERROR, not UNSET."""
    async with (
        raw_server(script) as server,
        AsyncSearchClient(
            API_KEY, base_url=server.base_url, max_retries=1, timeout=Timeout(read=0.2)
        ) as client,
    ):
        with pytest.raises(error) as caught:
            await client.get_extraction(JOB_ID)
    assert type(caught.value) is error
    (span,) = spans()
    attributes = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == error.__name__
    assert attributes["error.type"] == f"asyncsearch.{error.__name__}"  # its qualified name
    assert attributes["asyncsearch.attempts"] == 2
    assert "http.response.status_code" not in attributes
    (retry,) = span.events
    assert (retry.attributes or {})["asyncsearch.retry.reason"] == error.__name__


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [
        span
        for span in spans
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    ]


@pytest.mark.parametrize("embeddings", [True, False])
@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("walk", ["search_pages", "search_hits"])
async def test_a_pager_makes_one_parent_with_a_child_per_page(
    serve: Serve,
    spans: Callable[[], list[ReadableSpan]],
    walk: str,
    prefetch: bool,
    embeddings: bool,
) -> None:
    server = await serve(service(pages=3))
    async with make_client(server) as client:
        pager = getattr(client, walk)(QUERY, prefetch=prefetch, embeddings=embeddings)
        async with pager:
            got = [item async for item in pager]
    assert got
    (parent,) = [span for span in spans() if span.name == f"asyncsearch.{walk}"]
    assert parent.kind is SpanKind.INTERNAL
    children = _children(spans(), parent)
    assert [span.name for span in children] == ["asyncsearch.search"] * 3
    assert [(span.attributes or {})["asyncsearch.search.page"] for span in children] == [1, 2, 3]
    assert len(spans()) == 4
    hits = len(json.loads(ANSWERS["search"])["hits"])
    assert [(span.attributes or {})["asyncsearch.search.hits"] for span in children] == [hits] * 3
    assert all(child.end_time <= parent.end_time for child in children)  # type: ignore[operator]
    pages = [dict(event.attributes or {}) for event in parent.events]
    assert pages == [
        {"asyncsearch.search.page": n, "asyncsearch.search.hits": hits} for n in (1, 2, 3)
    ]
    assert not [t for span in spans() for t in _texts(span) if QUERY in t or API_KEY in t]


async def test_a_page_the_walk_never_decodes_still_ends_its_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    """A service that ignores the page number: page 2 repeats page 1, is read only far enough to
    see it, and is never decoded; its span ends with the walk's, with its hit count."""
    body = json.loads(ANSWERS["search"])
    body["hasMore"] = True

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    server = await serve(handler)
    async with make_client(server) as client:
        pages = [page async for page in client.search_pages(QUERY)]
    assert len(pages) == 1
    ended = spans()
    (parent,) = [span for span in ended if span.name == "asyncsearch.search_pages"]
    children = _children(ended, parent)
    assert len(ended) == 3
    assert [(s.attributes or {})["asyncsearch.search.page"] for s in children] == [1, 2]
    assert [(s.attributes or {})["asyncsearch.search.hits"] for s in children] == [
        len(body["hits"])
    ] * 2
    assert all(child.end_time <= parent.end_time for child in children)  # type: ignore[operator]


@pytest.mark.parametrize("hits_first", [False, True])
async def test_a_walk_page_that_does_not_decode_ends_its_span_in_error(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], hits_first: bool
) -> None:
    """Page 2's hit has a number for an id: its span ends in ERROR, whether the first bytes
    told the walk there is no page 3 (then decoded at once) or not (then read by the view)."""
    good = json.loads(ANSWERS["search"])
    good["hasMore"] = True
    bad: dict[str, Any] = {"total": 1, "hasMore": False, "hits": [{"id": 5}]}
    if hits_first:
        bad = {"hits": bad["hits"], "total": 1, "hasMore": False}

    async def handler(request: web.Request) -> web.StreamResponse:
        page = json.loads(await request.read())["pagination"]["page"]
        return web.json_response(good if page == 1 else bad)

    server = await serve(handler)
    async with make_client(server) as client:
        with pytest.raises(ResponseValidationError):
            async for _ in client.search_pages(QUERY):
                pass
    ended = spans()
    (parent,) = [span for span in ended if span.name == "asyncsearch.search_pages"]
    first, second = _children(ended, parent)
    assert first.status.status_code is StatusCode.UNSET
    assert (first.attributes or {})["asyncsearch.search.hits"] == len(good["hits"])
    assert second.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})[
        "error.type"
    ] == "asyncsearch.ResponseValidationError"  # a 200: not its status
    assert parent.status.status_code is StatusCode.ERROR
    assert len(ended) == 3


@pytest.mark.parametrize("bulk", ["gather_extractions", "iter_extractions"])
async def test_a_bulk_call_makes_one_parent_with_a_child_per_id(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], bulk: str
) -> None:
    server = await serve(service(statuses=[404]))
    async with make_client(server) as client:
        if bulk == "gather_extractions":
            results = await client.gather_extractions(IDS, concurrency=1)
        else:
            async with client.iter_extractions(IDS, concurrency=1) as it:
                results = [result async for result in it]
    assert sorted(result.ok for result in results) == [False, True, True, True, True]
    (parent,) = [span for span in spans() if span.name == f"asyncsearch.{bulk}"]
    children = _children(spans(), parent)
    assert [span.name for span in children] == ["asyncsearch.get_extraction"] * 5
    assert len(spans()) == 6
    errors = [(s.attributes or {}).get("error.type") for s in children]
    assert sorted(errors, key=str) == ["404"] + [None] * 4
    assert (parent.attributes or {})["asyncsearch.bulk.ids"] == 5
    assert (parent.attributes or {})["asyncsearch.bulk.failed"] == 1
    # Every child ended before its parent.
    assert all(child.end_time <= parent.end_time for child in children)  # type: ignore[operator]


async def test_the_readme_pattern_ends_each_span_once_and_never_touches_it_after(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], caplog: pytest.LogCaptureFixture
) -> None:
    """``async with client.iter_extractions(...)`` around a loop that runs to the end: the walk
    ends its span, then ``async with`` closes it and the finaliser runs: nothing more is done."""
    caplog.set_level(logging.WARNING, logger="opentelemetry")
    server = await serve(service(statuses=[404]))
    async with make_client(server) as client:
        async with client.iter_extractions(IDS, concurrency=2) as results:
            async for _ in results:
                pass
        await results.aclose()
        del results
        gc.collect()
    ended = spans()
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not [m for m in warned if "ended span" in m], warned
    assert len({span.context.span_id for span in ended}) == len(ended) == 6
    (parent,) = [span for span in ended if span.name == "asyncsearch.iter_extractions"]
    assert (parent.attributes or {})["asyncsearch.bulk.ids"] == 5
    assert (parent.attributes or {})["asyncsearch.bulk.failed"] == 1


async def test_wait_for_extraction_is_a_parent_of_its_polls(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    pending = json.dumps({**json.loads(ANSWERS["extract"]), "state": "pending"}).encode()
    answers = [pending, pending, ANSWERS["extract"]]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=answers.pop(0), content_type="application/json")

    server = await serve(handler)
    async with make_client(server) as client:
        await client.wait_for_extraction(JOB_ID, interval=0.01)
    (parent,) = [span for span in spans() if span.name == "asyncsearch.wait_for_extraction"]
    assert [s.name for s in _children(spans(), parent)] == ["asyncsearch.get_extraction"] * 3
    assert (parent.attributes or {})["asyncsearch.job.state"] == "completed"


def _hanging(arrived: asyncio.Event, gate: asyncio.Event) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        kind = _kind(request.path)
        if kind == "search" and json.loads(await request.read())["pagination"]["page"] == 1:
            body = json.loads(ANSWERS["search"])
            body["hasMore"] = True
            return web.json_response(body)
        arrived.set()
        await gate.wait()
        return web.Response(body=ANSWERS[kind], content_type="application/json")

    return handler


async def test_cancelling_a_call_ends_its_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    arrived, gate = asyncio.Event(), asyncio.Event()
    server = await serve(_hanging(arrived, gate))
    try:
        async with make_client(server) as client:
            call = asyncio.create_task(client.get_extraction(JOB_ID))
            await arrived.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            (span,) = spans()
    finally:
        gate.set()
    assert span.name == "asyncsearch.get_extraction"
    assert (span.attributes or {})["asyncsearch.cancelled"] is True
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize("how", ["aclose", "break", "cancel"])
async def test_leaving_a_pager_ends_its_span_and_the_prefetch_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], how: str
) -> None:
    arrived, gate = asyncio.Event(), asyncio.Event()
    server = await serve(_hanging(arrived, gate))
    try:
        async with make_client(server) as client:
            if how == "cancel":

                async def walk() -> None:
                    async for _ in client.search_pages(QUERY):
                        pass

                task = asyncio.create_task(walk())
                await arrived.wait()  # the walk waits for page 2, which does not come
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                pager = client.search_pages(QUERY)
                async for _ in pager:
                    await arrived.wait()
                    break
                if how == "aclose":
                    await pager.aclose()
                else:
                    del pager  # a bare break: the dropped pager's finaliser cleans up
                    for _ in range(100):
                        if len(spans()) == 3:
                            break
                        await asyncio.sleep(0.01)
            ended = spans()
    finally:
        gate.set()
    (parent,) = [span for span in ended if span.name == "asyncsearch.search_pages"]
    children = _children(ended, parent)
    assert [(s.attributes or {})["asyncsearch.search.page"] for s in children] == [1, 2]
    assert (children[1].attributes or {})["asyncsearch.cancelled"] is True
    if how == "cancel":
        assert (parent.attributes or {})["asyncsearch.cancelled"] is True


async def test_cancelling_a_bulk_call_ends_every_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    arrived, gate = asyncio.Event(), asyncio.Event()
    server = await serve(_hanging(arrived, gate))
    try:
        async with make_client(server) as client:
            call = asyncio.create_task(client.gather_extractions(IDS, concurrency=5))
            await arrived.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            ended = spans()
    finally:
        gate.set()
    (parent,) = [span for span in ended if span.name == "asyncsearch.gather_extractions"]
    assert (parent.attributes or {})["asyncsearch.cancelled"] is True
    children = _children(ended, parent)
    assert children
    assert all((s.attributes or {})["asyncsearch.cancelled"] for s in children)


async def test_content_is_traced_only_when_asked(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await serve(service())
    async with make_client(server, trace_content=True) as client:
        await client.search(QUERY)
        await client.link_preview("https://example.com/secret-page")
    monkeypatch.setenv("ASYNCSEARCH_TRACE_CONTENT", "1")
    async with make_client(server) as client:
        await client.search(QUERY)
        async for _ in client.search_pages(QUERY):
            pass
    async with make_client(server, trace_content=False) as client:
        await client.search(QUERY)
    searched, link, from_env, walked, walk, not_asked = spans()
    assert QUERY in json.loads(str((searched.attributes or {})["asyncsearch.request.body"]))["text"]
    assert "secret-page" in str((link.attributes or {})["url.full"])
    assert QUERY in str((from_env.attributes or {})["asyncsearch.request.body"])
    assert (walk.attributes or {})["asyncsearch.search.text"] == QUERY
    assert QUERY in str((walked.attributes or {})["asyncsearch.request.body"])
    assert not [t for t in _texts(not_asked) if QUERY in t]
    # Never the key, whatever is traced.
    assert not [t for span in spans() for t in _texts(span) if API_KEY in t]


async def test_tracing_false_makes_no_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    server = await serve(service())
    async with make_client(server, tracing=False) as client:
        await client.search(QUERY)
        await client.gather_extractions(IDS)
        async with client.with_options(tracing=True) as traced:
            await traced.get_extraction(JOB_ID)
    assert [span.name for span in spans()] == ["asyncsearch.get_extraction"]


async def test_a_call_span_is_a_child_of_the_callers_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]]
) -> None:
    server = await serve(service())
    tracer = trace.get_tracer("the-application")
    async with make_client(server) as client:
        with tracer.start_as_current_span("handle-request") as outer:
            await client.get_extraction(JOB_ID)
            await client.gather_extractions(IDS[:2])
    ended = spans()
    (mine,) = [span for span in ended if span.name == "handle-request"]
    assert [s.name for s in _children(ended, mine)] == [
        "asyncsearch.get_extraction",
        "asyncsearch.gather_extractions",
    ]
    assert outer.get_span_context().trace_id == ended[0].context.trace_id


def test_a_blocking_call_span_is_a_child_of_the_span_in_the_callers_thread(
    spans: Callable[[], list[ReadableSpan]],
) -> None:
    # Issue 46: a view of a threaded web app (Django, Flask) calls the SearchClient, whose calls
    # run on its own loop thread: the view's span still parents them.
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", service())
    tracer = trace.get_tracer("the-application")
    with ThreadedServer(app) as server, SearchClient(API_KEY, base_url=server.base_url) as client:
        with tracer.start_as_current_span("handle-request"):
            client.get_extraction(JOB_ID)
            client.gather_extractions(IDS[:2])
        client.search(QUERY)  # outside the view: a span of its own
    ended = spans()
    (mine,) = [span for span in ended if span.name == "handle-request"]
    assert [s.name for s in _children(ended, mine)] == [
        "asyncsearch.get_extraction",
        "asyncsearch.gather_extractions",
    ]
    (alone,) = [span for span in ended if span.name == "asyncsearch.search"]
    assert alone.parent is None


_WITHOUT_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # `import opentelemetry` raises ImportError
from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator

async def main():
    async with ServiceEmulator(seed=7) as emulator:
        async with AsyncSearchClient(emulator.api_key, base_url=emulator.base_url) as client:
            page = await client.search("invoice", page_size=2)
            results = await client.gather_extractions([], concurrency=2)
            async for _ in client.search_pages("invoice", page_size=2, max_pages=2):
                pass
    print(len(page.hits), results)

asyncio.run(main())
"""


def _printed_by(script: str) -> list[str]:
    """The words ``script`` printed, run in a fresh interpreter (warnings are errors there): the
    global providers, and whether opentelemetry imports at all, are the process's own."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_without_opentelemetry_every_call_works_and_nothing_imports_it() -> None:
    assert _printed_by(_WITHOUT_OTEL) == ["2", "[]"]
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, asyncsearch; print('opentelemetry' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
        check=True,
    )
    assert imported.stdout.strip() == "False"


# The duration histogram, read from the process's global meter provider (set once, like the
# tracer provider). Delta temporality: each read holds what was recorded since the one before.
_METRICS = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})


@pytest.fixture(scope="module", autouse=True)
def _meter_provider() -> None:
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS]))


Durations = Callable[[], list[tuple[dict[str, Any], int]]]


@pytest.fixture
def durations() -> Durations:
    """The histogram's points recorded during the test: (attributes, count), sorted."""
    provider = metrics.get_meter_provider()
    assert isinstance(provider, MeterProvider)
    _METRICS.get_metrics_data()  # what earlier tests recorded is dropped

    def read() -> list[tuple[dict[str, Any], int]]:
        data = _METRICS.get_metrics_data()
        points: list[tuple[dict[str, Any], int]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                if scope.scope.name != "asyncsearch":
                    continue
                for metric in scope.metrics:
                    assert metric.name == "asyncsearch.client.operation.duration"
                    assert metric.unit == "s"
                    for point in metric.data.data_points:
                        assert isinstance(point, HistogramDataPoint)
                        assert point.sum >= 0
                        if point.count:
                            points.append((dict(point.attributes or {}), point.count))
        return sorted(points, key=lambda p: sorted(p[0].items()))

    return read


def _operation(server: Server, name: str, error: str | None = None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "asyncsearch.operation.name": name,
        "server.address": "127.0.0.1",
        "server.port": int(server.base_url.rsplit(":", 1)[1]),
    }
    if error is not None:
        attributes["error.type"] = error
    return attributes


def _sorted(points: list[tuple[dict[str, Any], int]]) -> list[tuple[dict[str, Any], int]]:
    return sorted(points, key=lambda p: sorted(p[0].items()))


@pytest.mark.parametrize("recording", [True, False])
async def test_the_histogram_records_one_value_per_call(
    serve: Serve,
    spans: Callable[[], list[ReadableSpan]],
    durations: Durations,
    recording: bool,
) -> None:
    """One value per call the caller made, retried or not, failed or not; a walk, a bulk call and
    a wait are one call each (not one per request). Also when no span records (an unsampled
    parent): the histogram does not depend on tracing being sampled."""
    server = await serve(service(statuses=[503, 200, 404], pages=3))
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(trace_id=1, span_id=1, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with contextlib.ExitStack() as stack:
        if not recording:
            stack.enter_context(trace.use_span(unsampled))
        async with make_client(server) as client:
            await client.get_extraction(JOB_ID)  # 503, then 200: one call
            with pytest.raises(NotFoundError):
                await client.get_extraction(JOB_ID)
            await client.with_raw_response.search(QUERY)
            async with client.search_pages(QUERY) as pager:
                assert len([page async for page in pager]) == 3
            await client.gather_extractions(IDS[:3])
            await client.wait_for_extraction(JOB_ID)
    assert durations() == _sorted(
        [
            (_operation(server, "gather_extractions"), 1),
            (_operation(server, "get_extraction"), 1),
            (_operation(server, "get_extraction", "404"), 1),
            (_operation(server, "search"), 1),
            (_operation(server, "search_pages"), 1),
            (_operation(server, "wait_for_extraction"), 1),
        ]
    )
    assert bool(spans()) is recording


async def test_a_call_failing_without_an_answer_records_its_error_class(
    durations: Durations,
) -> None:
    async with (
        raw_server(_close_at_once) as server,
        AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=0) as client,
    ):
        with pytest.raises(APIConnectionError):
            await client.get_extraction(JOB_ID)
    ((attributes, count),) = durations()
    assert count == 1
    assert attributes["error.type"] == "asyncsearch.APIConnectionError"


async def test_a_cancelled_call_records_its_duration_as_cancelled(
    serve: Serve, durations: Durations
) -> None:
    arrived, gate = asyncio.Event(), asyncio.Event()
    server = await serve(_hanging(arrived, gate))
    try:
        async with make_client(server) as client:
            call = asyncio.create_task(client.get_extraction(JOB_ID))
            await arrived.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    finally:
        gate.set()
    assert durations() == [
        (_operation(server, "get_extraction", "asyncio.exceptions.CancelledError"), 1)
    ]


async def test_tracing_false_records_no_duration(serve: Serve, durations: Durations) -> None:
    server = await serve(service())
    async with make_client(server, tracing=False) as client:
        await client.get_extraction(JOB_ID)
        await client.gather_extractions(IDS[:2])
    assert durations() == []


def test_the_key_and_the_query_are_never_a_metric_attribute() -> None:
    """Only the operation, the server and the error type: nothing the caller sent."""
    tracing = Tracing(base_url="http://127.0.0.1:9/", enabled=True, content=True)
    span = tracing.call("search")
    assert isinstance(span, CallSpan)
    span.end(ValueError(API_KEY))
    data = _METRICS.get_metrics_data()
    values = [
        str(value)
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
        for value in (point.attributes or {}).values()
    ]
    assert "ValueError" in values
    assert not [v for v in values if API_KEY in v]


@pytest.mark.parametrize(
    ("target", "redacted"),
    [
        ("/v2/extract/1", "/v2/extract/1"),
        ("/v2/link-preview?url=https%3A%2F%2Fx.test%2Fa%3Fb%3D1", "/v2/link-preview?url=REDACTED"),
        (
            "/v2/logs?cursor=abc&limit=10&flag&empty=",
            "/v2/logs?cursor=REDACTED&limit=REDACTED&flag&empty=REDACTED",
        ),
    ],
)
def test_url_full_keeps_query_names_and_redacts_values(target: str, redacted: str) -> None:
    assert redact_query(target) == redacted


_UNCONFIGURED = """
import asyncio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from asyncsearch._tracing import NO_SPAN, Tracing

tracing = Tracing(base_url="http://127.0.0.1:9", enabled=True, content=False)
print(tracing.call("search") is NO_SPAN)  # no provider of either kind: nothing at all is done
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
span = tracing.call("search")
print(span is NO_SPAN)
span.end()
(scope,) = reader.get_metrics_data().resource_metrics[0].scope_metrics
(point,) = scope.metrics[0].data.data_points
print(point.count)
"""


def test_with_no_meter_provider_set_a_call_is_not_even_timed() -> None:
    assert _printed_by(_UNCONFIGURED) == ["True", "False", "1"]


_NO_TRACER_PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from asyncsearch._protocol import get_extraction
from asyncsearch._tracing import NO_SPAN, Tracing

started = []
for kind in (trace.ProxyTracer, trace.NoOpTracer):
    def counted(self, *args, _start=kind.start_span, **kwargs):
        started.append(type(self).__name__)
        return _start(self, *args, **kwargs)
    kind.start_span = counted
tracing = Tracing(base_url="http://127.0.0.1:9", enabled=True, content=False)
request = get_extraction("00000000-0000-4000-8000-000000000001")
print(tracing.call("get_extraction", request) is NO_SPAN, len(started))
trace.set_tracer_provider(TracerProvider())
span = tracing.call("get_extraction", request)
print(span is NO_SPAN, span.context is not None)
span.end()
"""


def test_until_a_tracer_provider_is_set_no_span_is_started() -> None:
    """The API's own provider makes spans that record nothing: none is started (not even one of
    the API's), and a provider set later is used from the next call on."""
    assert _printed_by(_NO_TRACER_PROVIDER) == ["True", "0", "False", "True"]


@pytest.fixture
def aiohttp_instrumented() -> Iterator[None]:
    """aiohttp instrumented by opentelemetry-instrumentation-aiohttp-client for one test.

    The instrumentor patches ``aiohttp.ClientSession.__init__`` for the whole process: it is
    undone however the test ends, and only sessions made inside the test are instrumented (an
    xdist worker runs one test at a time, so no other test makes a session meanwhile).
    """
    instrumentation = pytest.importorskip(
        "opentelemetry.instrumentation.aiohttp_client",
        reason="needs opentelemetry-instrumentation-aiohttp-client (in the test extra)",
    )
    instrumentor = instrumentation.AioHttpClientInstrumentor()
    instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
    try:
        yield
    finally:
        instrumentor.uninstrument()


async def test_instrumented_aiohttp_spans_are_one_per_attempt_under_the_call_span(
    serve: Serve, spans: Callable[[], list[ReadableSpan]], aiohttp_instrumented: None
) -> None:
    server = await serve(service(statuses=[503, 503, 200]))
    async with make_client(server) as client:
        await client.get_extraction(JOB_ID)
    ended = spans()
    (call,) = [span for span in ended if span.name == "asyncsearch.get_extraction"]
    attempts = [span for span in ended if span is not call]
    assert len(attempts) == 3
    assert _children(ended, call) == attempts  # each attempt's span is the call span's child
    assert all(span.kind is SpanKind.CLIENT for span in attempts)
    # Named by the old or the stable HTTP conventions (OTEL_SEMCONV_STABILITY_OPT_IN).
    statuses = [
        dict(span.attributes or {}).get("http.response.status_code")
        or dict(span.attributes or {}).get("http.status_code")
        for span in attempts
    ]
    assert statuses == [503, 503, 200]
    assert (call.attributes or {})["asyncsearch.attempts"] == 3
    assert not [t for span in ended for t in _texts(span) if API_KEY in t]


class _PrivateError(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            NotFoundError(
                "gone", status_code=404, headers={}, body=None, method="GET", url="http://x/"
            ),
            "404",
        ),
        (APITimeoutError(), "asyncsearch.APITimeoutError"),
        (ValueError("x"), "ValueError"),
        (asyncio.CancelledError(), "asyncio.exceptions.CancelledError"),
        (_PrivateError(), f"{__name__}._PrivateError"),
        # Not a public name: by the module that defines it.
        (CommandError("x"), "asyncsearch._cli._run.CommandError"),
    ],
)
def test_error_type_takes_the_conventions_values(error: BaseException, expected: str) -> None:
    assert error_type(error) == expected
