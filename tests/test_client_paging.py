"""search_pages / search_hits over a loopback server: end conditions, resume, prefetch, cleanup."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from asyncsearch import AsyncSearchClient, InvalidRequestError, SearchHit, SearchPage

from .conftest import API_KEY, Handler, Server
from .helpers import ThreadedServer, client_tasks, held_connections

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
    arrivals: dict[int, float] | None = None,
) -> Handler:
    """A search endpoint with ``total`` hits, pages counted from 1."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        pagination = body.get("pagination", {})
        page = 1 if ignore_page else pagination.get("page", 1)
        size = pagination.get("pageSize", 10)
        if arrivals is not None:
            arrivals[page] = time.monotonic()
        if latency:
            await asyncio.sleep(latency)
        start = max((page - 1) * size - overlap * (page > 1), 0)
        hits = [hit(i) for i in range(start, min(start + size, total))]
        if empty_from is not None and page >= empty_from:
            hits = []
        answer = {"total": total, "hasMore": page * size < total, "hits": hits}
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


async def test_max_pages_warns_and_resumes(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    server = await serve(paged_search(50))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        pager = client.search_hits("q", page_size=10, max_pages=2)
        first = [h.id async for h in pager]
        assert len(first) == 20
        assert pager.next_page == 3
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
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


async def test_server_ignoring_the_page_number_ends_quietly(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    server = await serve(paged_search(100, ignore_page=True))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        ids = [h.id async for h in client.search_hits("q", page_size=10)]
    assert ids == [f"hit-{i}" for i in range(10)]
    assert len(server.seen) == 2
    assert any(r.levelno == logging.WARNING for r in caplog.records)


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


def busy(seconds: float) -> None:
    """CPU-bound work that never yields to the event loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("prefetch", [True, False])
async def test_prefetch_sends_the_next_request_before_the_caller_finishes(prefetch: bool) -> None:
    arrivals: dict[int, float] = {}
    finished: dict[int, float] = {}
    app = web.Application()
    app.router.add_post("/v2/search", paged_search(50, latency=0.02, arrivals=arrivals))
    with ThreadedServer(app) as server:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            number = 0
            async for page in client.search_pages("q", page_size=10, prefetch=prefetch):
                number += 1
                assert page.hits
                busy(0.05)  # blocks the loop: only a request already sent makes progress
                finished[number] = time.monotonic()
    assert number == 5
    for n in range(1, 5):
        if prefetch:
            assert arrivals[n + 1] < finished[n], f"page {n + 1} was not requested in time"
        else:
            assert arrivals[n + 1] > finished[n]


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
