"""search_pages / search_hits over a loopback server: end conditions, resume, prefetch, cleanup."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from asyncsearch import (
    APITimeoutError,
    AsyncSearchClient,
    InvalidRequestError,
    ResponseValidationError,
    SearchHit,
    SearchPage,
    Timeout,
    _call,
    _protocol,
)

from .conftest import API_KEY, Handler, Server
from .helpers import TIME_SCALE, ThreadedServer, client_tasks, held_connections

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(20)


def hit(i: int) -> dict[str, Any]:
    return {"id": f"hit-{i}", "name": f"Resource {i}", "score": 1.0 - i / 1000}


def paged_search(
    total: int,
    *,
    latency: float = 0.0,
    ignore_page: bool = False,
    empty_from: int | None = None,
    overlap: int = 0,
    arrived: dict[int, threading.Event] | None = None,
    hits_first: bool = False,
    compact: bool = False,
) -> Handler:
    """A search endpoint with ``total`` hits, pages counted from 1.

    Its answers list ``total``, ``hasMore`` and ``hits`` in the spec's order, as the service
    does, or with ``hits_first`` the hits before the rest (the walk cannot tell from the first
    bytes then whether there is a next page).
    """

    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        pagination = body.get("pagination", {})
        page = 1 if ignore_page else pagination.get("page", 1)
        size = pagination.get("pageSize", 10)
        if arrived is not None and page in arrived:
            arrived[page].set()
        if latency:
            await asyncio.sleep(latency)
        start = max((page - 1) * size - overlap * (page > 1), 0)
        hits = [hit(i) for i in range(start, min(start + size, total))]
        if empty_from is not None and page >= empty_from:
            hits = []
        answer = {"total": total, "hasMore": page * size < total, "hits": hits}
        if hits_first:
            answer = {"hits": hits, "total": total, "hasMore": answer["hasMore"]}
        if compact:  # no spaces, as msgspec writes (and the emulator)
            return web.json_response(answer, dumps=lambda o: json.dumps(o, separators=(",", ":")))
        return web.json_response(answer)

    return handler


def searches(server: Server) -> list[int]:
    return [json.loads(seen.body).get("pagination", {}).get("page") for seen in server.seen]


async def test_search_hits_walks_every_page(serve: Serve) -> None:
    server = await serve(paged_search(45))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        pager = client.search_hits("q", page_size=10)
        assert pager.next_page == 1
        assert pager.total is None
        ids = [h.id async for h in pager]
    assert ids == [f"hit-{i}" for i in range(45)]
    assert searches(server) == [1, 2, 3, 4, 5]
    assert pager.next_page is None
    assert pager.total == 45
    # Every page carries the same query.
    assert {json.loads(s.body)["text"] for s in server.seen} == {"q"}


async def test_search_pages_yields_typed_pages(serve: Serve) -> None:
    server = await serve(paged_search(25))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        pages = [p async for p in client.search_pages("q", page_size=10, prefetch=False)]
    assert all(isinstance(p, SearchPage) for p in pages)
    assert [len(p.hits) for p in pages] == [10, 10, 5]
    assert [p.has_more for p in pages] == [True, True, False]


async def test_first_page_option_and_start_page(serve: Serve) -> None:
    server = await serve(paged_search(30))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, first_page=2) as client:
        ids = [h.id async for h in client.search_hits("q", page_size=10)]
        assert ids[0] == "hit-10"
        ids = [h.id async for h in client.search_hits("q", page_size=10, start_page=3)]
        assert ids == [f"hit-{i}" for i in range(20, 30)]


async def test_max_pages_logs_at_debug_and_resumes(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsearch")
    server = await serve(paged_search(50))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        pager = client.search_hits("q", page_size=10, max_pages=2)
        first = [h.id async for h in pager]
        assert len(first) == 20
        assert pager.next_page == 3
        # The cap was asked for: no WARNING, one DEBUG line saying where to resume.
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        capped = [r for r in caplog.records if "stopped paging" in r.getMessage()]
        assert [r.levelno for r in capped] == [logging.DEBUG]
        assert "start_page=3" in capped[0].getMessage()
        rest = [h.id async for h in client.search_hits("q", page_size=10, start_page=3)]
    assert first + rest == [f"hit-{i}" for i in range(50)]
    # The capped walk never asked for page 3.
    assert searches(server) == [1, 2, 3, 4, 5]


async def test_max_items_is_exact_and_fetches_no_extra_page(serve: Serve) -> None:
    server = await serve(paged_search(100))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ids = [h.id async for h in client.search_hits("q", page_size=10, max_items=25)]
    assert ids == [f"hit-{i}" for i in range(25)]
    assert searches(server) == [1, 2, 3]


@pytest.mark.parametrize("compact", [False, True])
async def test_server_ignoring_the_page_number_ends_quietly(
    serve: Serve, caplog: pytest.LogCaptureFixture, compact: bool
) -> None:
    # Compact, page 2's first bytes say hasMore too: the same bytes as page 1 keep the walk
    # from sending page 3 on their word.
    server = await serve(paged_search(100, ignore_page=True, compact=compact))
    # Its own bound: without the repeated-page guard this walk never ends.
    async with asyncio.timeout(5), AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ids = [h.id async for h in client.search_hits("q", page_size=10)]
    assert ids == [f"hit-{i}" for i in range(10)]
    assert len(server.seen) == 2
    assert any(r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize("page_size", [0, -1, -100])
async def test_a_page_size_below_one_is_refused_before_anything_is_sent(
    serve: Serve, page_size: int
) -> None:
    server = await serve(paged_search(100))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(InvalidRequestError, match="page_size"):
            await client.search("q", page_size=page_size)
        with pytest.raises(InvalidRequestError, match="page_size"):
            [p async for p in client.search_pages("q", page_size=page_size)]
        with pytest.raises(InvalidRequestError, match="page_size"):
            [h async for h in client.search_hits("q", page_size=page_size)]
        assert [h.id async for h in client.search_hits("q", page_size=1, max_items=2)] == [
            "hit-0",
            "hit-1",
        ]
    assert searches(server) == [1, 2]  # only the valid walk reached the server


async def test_empty_page_ends_the_walk_whatever_has_more_says(serve: Serve) -> None:
    server = await serve(paged_search(100, empty_from=3))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ids = [h.id async for h in client.search_hits("q", page_size=10)]
    assert len(ids) == 20
    assert searches(server) == [1, 2, 3]


async def test_dedupe_drops_hits_already_yielded(serve: Serve) -> None:
    server = await serve(paged_search(30, overlap=3))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        plain = [h.id async for h in client.search_hits("q", page_size=10)]
        deduped = [h.id async for h in client.search_hits("q", page_size=10, dedupe=True)]
        pages = [p async for p in client.search_pages("q", page_size=10, dedupe=True)]
    assert len(plain) > len(set(plain))
    assert len(deduped) == len(set(deduped))
    assert set(deduped) == set(plain)
    page_ids = [h.id for p in pages for h in p.hits]
    assert page_ids == deduped


async def test_arguments_are_validated_before_anything_is_sent(serve: Serve) -> None:
    server = await serve(paged_search(10))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(InvalidRequestError, match="text"):
            client.search_hits("x" * 300)
        with pytest.raises(InvalidRequestError, match="max_items"):
            client.search_hits("x", max_items=0)
        with pytest.raises(InvalidRequestError, match="page"):
            client.search_pages("x", start_page=-1)
    assert server.seen == []


@pytest.mark.parametrize("prefetch", [True, False])
async def test_prefetch_sends_the_next_request_before_the_caller_finishes(prefetch: bool) -> None:
    arrived = {n: threading.Event() for n in range(1, 7)}
    app = web.Application()
    app.router.add_post("/v2/search", paged_search(50, arrived=arrived))
    with ThreadedServer(app) as server:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            number = 0
            async for page in client.search_pages("q", page_size=10, prefetch=prefetch):
                number += 1
                assert page.hits
                # The caller's work blocks the loop: only a request already sent can reach the
                # server (in its own thread) meanwhile. Held by an event, not a stopwatch.
                if number < 5:
                    if prefetch:
                        assert arrived[number + 1].wait(10), f"page {number + 1} not sent ahead"
                    else:
                        assert not arrived[number + 1].wait(0.05)
    assert number == 5


async def _walk_then_leave(client: AsyncSearchClient, how: str) -> None:
    pager = client.search_hits("q", page_size=10)
    if how == "break":
        async for _ in pager:
            break
    elif how == "aclose":
        await pager.__anext__()
        await pager.aclose()
    elif how == "async with":
        async with pager:
            await pager.__anext__()
    elif how == "exception":
        with pytest.raises(ZeroDivisionError):  # noqa: PT012 - the raise is in the loop body
            async for _ in pager:
                1 / 0  # noqa: B018
    elif how == "cancel":
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in pager:
                started.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("how", ["break", "aclose", "async with", "exception", "cancel"])
async def test_every_way_of_leaving_cleans_up(serve: Serve, how: str) -> None:
    server = await serve(paged_search(1000, latency=0.05))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        await _walk_then_leave(client, how)
        for _ in range(5):
            await asyncio.sleep(0)
        assert client_tasks() == []
        seen = len(server.seen)
        await asyncio.sleep(0.15)
        assert len(server.seen) == seen, "a request was sent after the walk ended"
        assert seen <= 2
        assert held_connections(client) == 0


async def test_search_hits_yields_typed_hits(serve: Serve) -> None:
    server = await serve(paged_search(3))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        hits = [h async for h in client.search_hits("q")]
    assert all(isinstance(h, SearchHit) for h in hits)
    assert hits[0].score == pytest.approx(1.0)


# -- pipelined walks: the next request goes out before the page is decoded ---------------------


class _DecoderSpy:
    """Stands in for the SearchPage decoder; calls ``before`` ahead of every full decode."""

    def __init__(self, real: Any, before: Callable[[], None]) -> None:
        self._real = real
        self.type = real.type
        self._before = before

    def decode(self, body: bytes) -> Any:
        self._before()
        return self._real.decode(body)


@pytest.mark.parametrize("order", ["compact", "spec order", "hits first"])
@pytest.mark.parametrize("mode", ["pages", "hits"])
async def test_a_pipelined_walk_requests_the_next_page_before_decoding_this_one(
    monkeypatch: pytest.MonkeyPatch, mode: str, order: str
) -> None:
    # In the spec's order the first bytes of a page say whether there is a next one; hits
    # first, the view of the page says it. Either way the next request is out before the decode.
    arrived = {n: threading.Event() for n in range(1, 7)}
    inner = paged_search(50, hits_first=order == "hits first", compact=order == "compact")

    async def handler(request: web.Request) -> web.StreamResponse:
        page = json.loads(await request.read())["pagination"]["page"]
        arrived[page].set()
        return await inner(request)

    decoded = 0
    next_request_was_out: list[bool] = []

    def before_decode() -> None:
        # Blocks the client's loop, as decoding does: only a request already written can reach
        # the server (in its own thread) now. The wait ends at once when it did.
        nonlocal decoded
        decoded += 1
        if decoded < 5:
            next_request_was_out.append(arrived[decoded + 1].wait(timeout=2))

    monkeypatch.setattr(
        _protocol,
        "_search_page_decoder",
        _DecoderSpy(_protocol._search_page_decoder, before_decode),
    )
    app = web.Application()
    app.router.add_post("/v2/search", handler)
    with ThreadedServer(app) as server:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            if mode == "pages":
                pages = [p async for p in client.search_pages("q", page_size=10)]
                ids = [h.id for p in pages for h in p.hits]
                assert all(isinstance(p, SearchPage) for p in pages)
            else:
                ids = [h.id async for h in client.search_hits("q", page_size=10)]
    assert ids == [f"hit-{i}" for i in range(50)]
    assert decoded == 5
    assert next_request_was_out == [True] * 4
    assert not arrived[6].is_set(), "a page past the end was requested"


@pytest.mark.parametrize("prefetch", [True, False])
async def test_a_request_is_in_flight_while_the_caller_holds_a_page_only_with_prefetch(
    serve: Serve, prefetch: bool
) -> None:
    gates = {n: asyncio.Event() for n in range(1, 5)}
    gates[1].set()
    inner = paged_search(40)

    async def handler(request: web.Request) -> web.StreamResponse:
        # Each answer waits until the caller has looked at the page before it, so a request
        # sent ahead is still in flight when the caller checks.
        await gates[json.loads(await request.read())["pagination"]["page"]].wait()
        return await inner(request)

    server = await serve(handler)
    in_flight = 0
    most = 0
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        transport = client._shared.transport
        send = transport.send

        async def counting_send(*args: Any, **kwargs: Any) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await send(*args, **kwargs)
            finally:
                in_flight -= 1

        transport.send = counting_send  # type: ignore[method-assign]
        held: list[int] = []
        number = 0
        async for page in client.search_pages("q", page_size=10, prefetch=prefetch):
            number += 1
            for _ in range(10):
                await asyncio.sleep(0)
            held.append(in_flight)
            if number < 4:
                gates[number + 1].set()
            assert page.hits
    assert number == 4
    assert most == 1
    assert held == ([1, 1, 1, 0] if prefetch else [0, 0, 0, 0])
    assert searches(server) == [1, 2, 3, 4]


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("order", ["compact", "spec order", "hits first"])
async def test_the_walk_reads_each_page_once_and_its_view_only_when_it_helps(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, order: str, prefetch: bool
) -> None:
    reads = {"view": 0, "page": 0}

    def count(kind: str) -> Callable[[], None]:
        def counted() -> None:
            reads[kind] += 1

        return counted

    for name, kind in (("_search_page_head_decoder", "view"), ("_search_page_decoder", "page")):
        monkeypatch.setattr(_protocol, name, _DecoderSpy(getattr(_protocol, name), count(kind)))
    handler = paged_search(50, hits_first=order == "hits first", compact=order == "compact")
    server = await serve(handler)
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        walk = client.search_hits("q", page_size=10, prefetch=prefetch)
        ids = [h.id async for h in walk]
    assert ids == [f"hit-{i}" for i in range(50)]
    assert searches(server) == [1, 2, 3, 4, 5]
    # Compact, in the spec's order, the first bytes of pages 1-4 say there is more: the next
    # request goes out at once, and the page is read in one go; the last page's view decides.
    # Otherwise one view a page sends the next request before the decode. Without prefetch
    # nothing overlaps the decode: the walk decides on the page itself.
    views = (1 if order == "compact" else 5) if prefetch else 0
    assert reads == {"view": views, "page": 5}


def misleading_first_page(case: str) -> bytes:
    if case == "hasMore said twice":
        # Its first bytes say there is more; in full, JSON's last key wins: there is not.
        hits = json.dumps([hit(i) for i in range(3)]).encode()
        return b'{"total":3,"hasMore":true,"hits":' + hits + b',"hasMore":false}'
    # 30 hits where 10 were asked for: max_items=25 is reached on this page.
    return json.dumps({"total": 100, "hasMore": True, "hits": [hit(i) for i in range(30)]}).encode()


@pytest.mark.parametrize("case", ["hasMore said twice", "page larger than asked"])
async def test_a_request_sent_ahead_on_the_first_bytes_never_becomes_a_page(
    serve: Serve, case: str
) -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if json.loads(await request.read())["pagination"]["page"] == 1:
            return web.Response(body=misleading_first_page(case), content_type="application/json")
        await release.wait()  # held: only the client cancelling it ends this request
        return web.json_response({"total": 100, "hasMore": True, "hits": [hit(99)]})

    server = await serve(handler)
    try:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            max_items = 25 if case == "page larger than asked" else None
            ids: list[str] = []
            async for h in client.search_hits("q", page_size=10, max_items=max_items):
                if not ids:
                    # Page 1 is decoded, and a request sent ahead already cancelled: it does
                    # not run on while the caller works through the page.
                    assert client_tasks() == []
                ids.append(h.id)
            # The walk ended while page 2 was held: a request sent ahead was cancelled.
            assert ids == [f"hit-{i}" for i in range(3 if max_items is None else 25)]
            assert client_tasks() == []
            assert held_connections(client) == 0
    finally:
        release.set()
    # Its first bytes said hasMore: page 2 went out before the page was read, then was
    # cancelled (it may have reached the server). Reaching max_items on a page larger than
    # asked: never sent.
    assert searches(server) in (([1], [1, 2]) if case == "hasMore said twice" else ([1],))


def broken_page(page_two: dict[str, Any]) -> Handler:
    """Pages of 10 hits out of 100, page 2 replaced by ``page_two``."""
    inner = paged_search(100)

    async def handler(request: web.Request) -> web.StreamResponse:
        if json.loads(await request.read())["pagination"]["page"] == 2:
            return web.json_response(page_two)
        return await inner(request)

    return handler


async def test_a_page_that_fails_to_decode_ends_a_pipelined_walk(serve: Serve) -> None:
    # The view (hasMore, total, ids) reads fine, so page 3 is requested; the full decode then
    # fails on a field the view skipped.
    bad_hit = {**hit(10), "score": "not a number"}
    server = await serve(broken_page({"total": 100, "hasMore": True, "hits": [bad_hit]}))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=0) as client:
        pager = client.search_hits("q", page_size=10)
        ids: list[str] = []

        async def walk() -> None:
            async for h in pager:
                ids.append(h.id)

        with pytest.raises(ResponseValidationError, match=r"SearchPage at \$\.hits\[0\]\.score"):
            await walk()
        assert ids == [f"hit-{i}" for i in range(10)]
        assert pager.next_page == 2
        for _ in range(5):
            await asyncio.sleep(0)
        assert client_tasks() == []
        assert held_connections(client) == 0
        seen = searches(server)
        assert seen[:2] == [1, 2]
        assert seen[2:] in ([], [3])  # page 3 went out before the decode failed, if at all
        await asyncio.sleep(0.1)
        assert searches(server) == seen, "a request was sent after the walk ended"


async def test_a_page_the_view_cannot_read_raises_the_full_decode_error(serve: Serve) -> None:
    server = await serve(broken_page({"total": 100, "hits": [hit(10)]}))  # no hasMore
    async with AsyncSearchClient(API_KEY, base_url=server.base_url, max_retries=0) as client:
        with pytest.raises(ResponseValidationError, match=r"does not fit SearchPage\b") as caught:
            async for _ in client.search_pages("q", page_size=10):
                pass
    assert "hasMore" in str(caught.value)
    assert caught.value.attempts == 1
    # Whether there is a page 3 was never known: it was not requested.
    assert searches(server) == [1, 2]


@pytest.mark.parametrize("compact", [False, True])
async def test_a_pipelined_walk_stops_at_its_caps_and_guards_without_an_extra_request(
    serve: Serve, compact: bool
) -> None:
    # Compact, every page's first bytes say hasMore (the empty one's say it has no hits): the
    # caps, not those bytes, decide.
    server = await serve(paged_search(100, empty_from=4, compact=compact))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        pages = [p async for p in client.search_pages("q", page_size=10, max_pages=2)]
        assert [len(p.hits) for p in pages] == [10, 10]
        assert searches(server) == [1, 2]
        server.seen.clear()
        ids = [h.id async for h in client.search_hits("q", page_size=10, max_items=15)]
        assert ids == [f"hit-{i}" for i in range(15)]
        assert searches(server) == [1, 2]
        server.seen.clear()
        pages = [p async for p in client.search_pages("q", page_size=10)]
        assert [len(p.hits) for p in pages] == [10, 10, 10]  # the empty page 4 is no page
        assert searches(server) == [1, 2, 3, 4]
        for _ in range(5):
            await asyncio.sleep(0)
        assert client_tasks() == []
    await asyncio.sleep(0.05)
    assert searches(server) == [1, 2, 3, 4]


async def _walk(client: AsyncSearchClient, walk: str, prefetch: bool, **options: Any) -> int:
    """Walk every page of a search for "q" with the call's ``options``; the items walked."""
    async with getattr(client, walk)("q", page_size=10, prefetch=prefetch, **options) as pager:
        return len([item async for item in pager])


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("walk", ["search_pages", "search_hits"])
async def test_per_call_options_reach_every_page_of_a_walk(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, walk: str, prefetch: bool
) -> None:
    """Headers, query and max_retries given to the walk hold for page 3 as for page 1."""

    async def no_backoff(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", no_backoff)
    pages = paged_search(30)
    refused: set[int] = set()

    async def handler(request: web.Request) -> web.StreamResponse:
        page = json.loads(await request.read()).get("pagination", {}).get("page", 1)
        if page not in refused:  # every page's first attempt: only the call's retry gets it
            refused.add(page)
            return web.json_response({"message": "busy"}, status=503)
        return await pages(request)

    server = await serve(handler)
    async with AsyncSearchClient(
        API_KEY, base_url=server.base_url, max_retries=0, headers={"X-Client": "c"}
    ) as client:
        walked = await _walk(
            client,
            walk,
            prefetch,
            extra_headers={"X-Call": "yes"},
            extra_query={"trace": 7},
            max_retries=1,
        )
        called = len(server.seen)
        await client.search("q")  # the next call has none of them
    assert walked == (3 if walk == "search_pages" else 30)
    assert searches(server)[:called] == [1, 1, 2, 2, 3, 3]
    for seen in server.seen[:called]:
        assert (seen.headers["X-Call"], seen.headers["X-Client"], seen.query) == (
            "yes",
            "c",
            {"trace": "7"},
        )
    (after,) = server.seen[called:]
    assert "X-Call" not in after.headers
    assert after.query == {}


@pytest.mark.parametrize("prefetch", [True, False])
async def test_a_per_call_timeout_bounds_every_page_of_a_walk(serve: Serve, prefetch: bool) -> None:
    """Page 3 never answers: the walk's own read timeout ends it, not the client's minute."""
    pages = paged_search(30)
    gate = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if json.loads(await request.read())["pagination"]["page"] == 3:
            await gate.wait()
        return await pages(request)

    server = await serve(handler)
    try:
        async with AsyncSearchClient(
            API_KEY, base_url=server.base_url, timeout=Timeout(read=60 * TIME_SCALE)
        ) as client:
            async with asyncio.timeout(10 * TIME_SCALE):
                with pytest.raises(APITimeoutError):
                    await _walk(
                        client, "search_pages", prefetch, timeout=Timeout(read=0.2), max_retries=0
                    )
    finally:
        gate.set()
    assert searches(server) == [1, 2, 3]


async def test_a_hit_kept_from_a_walk_holds_only_its_own_text(serve: Serve) -> None:
    # Issue 37: three hits kept from a search_hits walk (one per 3.4 MB page), vectors unread,
    # held 10.3 MB: each hit's raw vectors were a slice of its page's whole answer.
    vector = [0.123456789] * 1024
    # Made before memory is traced: what is traced is the client's.
    bodies = {
        page: json.dumps(
            {
                "total": 300,
                "hasMore": page < 3,
                "hits": [
                    {**hit(page * 100 + i), "embeddings": {"small3_512": vector, "clip2": vector}}
                    for i in range(100)
                ],
            }
        ).encode()
        for page in (1, 2, 3)
    }

    async def handler(request: web.Request) -> web.StreamResponse:
        page = json.loads(await request.read())["pagination"]["page"]
        return web.Response(body=bodies[page], content_type="application/json")

    server = await serve(handler)
    kept: list[SearchHit] = []
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        tracemalloc.start()
        try:
            async for found in client.search_hits("invoice", page_size=100, prefetch=False):
                if found.id.endswith("00"):
                    kept.append(found)  # the first hit of each page
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(kept) == 3
    # A page's answer is ~2.3 MB; three hits' own vectors ~70 KB. (Before: ~7 MB held.)
    assert held < 1_000_000, held
    assert [len(found.embeddings.small3_512) for found in kept] == [1024] * 3  # type: ignore[union-attr]


def test_a_page_round_trips_through_to_dict() -> None:
    # msgspec.convert(page.to_dict(), SearchPage) fails: a hit's embeddings are raw JSON text.
    body = (Path(__file__).parent / "samples" / "search_page.json").read_bytes()
    page = msgspec.json.decode(body, type=SearchPage)
    again = SearchPage.from_dict(page.to_dict())
    assert again == page
    assert again.to_json() == page.to_json()
    with pytest.raises(InvalidRequestError, match=r"SearchPage.from_dict\(\).*total"):
        SearchPage.from_dict({**page.to_dict(), "total": "many"})
