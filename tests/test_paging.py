"""The page walker (``SearchPager``) over a fake service, without a network: every way a walk
ends, the caps, the guards, dedupe, the resume point, prefetch and cleanup."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import anyio
import msgspec
import pytest

from asyncsearch import SearchHit, SearchPage, _protocol
from asyncsearch._errors import InvalidRequestError
from asyncsearch._paging import SearchPager
from asyncsearch._protocol import Request
from asyncsearch._tracing import CallSpan, LazySpan, Tracing

from .helpers import (  # noqa: F401 - no_loop_errors is an autouse fixture
    WAYS_OUT,
    Boom,
    no_loop_errors,
    other_tasks,
    turns,
)

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass(frozen=True)
class FakePage:
    number: int
    items: tuple[str, ...]
    more: bool
    total: int = 0

    def body(self, *, hits_first: bool = False) -> bytes:
        """The page as the service writes it (``hits_first``: the hits before ``hasMore``)."""
        hits = [{"id": item} for item in self.items]
        page = {"total": self.total, "hasMore": self.more, "hits": hits}
        if hits_first:
            page = {"hits": hits, "total": self.total, "hasMore": self.more}
        return msgspec.json.encode(page)


class FakeService:
    """Pages served by a function of the page number, with a record of the fetches made."""

    def __init__(self, page: Callable[[int], FakePage], latency: float = 0.0) -> None:
        self.page = page
        self.latency = latency
        self.calls: list[int] = []

    async def fetch(self, n: int) -> FakePage:
        self.calls.append(n)
        await asyncio.sleep(self.latency)
        return self.page(n)


def catalogue(n_items: int, page_size: int) -> Callable[[int], FakePage]:
    """A well-behaved service: n_items items in pages of page_size, numbered from 1."""
    ids = [f"i{k}" for k in range(n_items)]

    def page(n: int) -> FakePage:
        chunk = tuple(ids[(n - 1) * page_size : n * page_size])
        return FakePage(n, chunk, more=n * page_size < n_items, total=n_items)

    return page


def endless(page_size: int) -> Callable[[int], FakePage]:
    def page(n: int) -> FakePage:
        return FakePage(n, tuple(f"i{n}-{k}" for k in range(page_size)), more=True)

    return page


class FakeAnswer:
    """What the client's send gives back: the body, and its full decode (counted)."""

    decoded: ClassVar[list[int]] = []

    def __init__(self, number: int, body: bytes) -> None:
        self.number = number
        self.content = body

    def parse(self) -> SearchPage:
        FakeAnswer.decoded.append(self.number)
        return _protocol.decode_body(msgspec.json.Decoder(SearchPage), self.content)


class Walk(SearchPager[Any]):
    """The walker over a fake service: pages as ``FakePage`` (numbered by the walk), hits as ids."""

    async def __anext__(self) -> Any:
        got = await super().__anext__()
        if isinstance(got, SearchHit):
            return got.id
        number = self.next_page - 1 if self.next_page is not None and not self._cut else None
        return FakePage(number or 0, tuple(hit.id for hit in got.hits), got.has_more, got.total)


def make_pager(
    fetch: Callable[[int], Awaitable[FakePage]],
    *,
    mode: str = "pages",
    start_page: int = 1,
    hits_first: bool = False,
    **kwargs: Any,
) -> Walk:
    def page_request(number: int) -> Request[Any]:
        return _protocol.search("q", page=number)

    async def send(request: Request[Any], span: CallSpan) -> FakeAnswer:
        number = msgspec.json.decode(request.body)["pagination"]["page"]
        page = await fetch(number)
        return FakeAnswer(number, page.body(hits_first=hits_first))

    options: dict[str, Any] = {"max_pages": None, "max_items": None, "prefetch": True}
    options.update({"dedupe": False, **kwargs})
    tracing = Tracing(base_url="http://127.0.0.1", enabled=False, content=False)
    return Walk(
        page_request,
        send,
        items=mode == "items",
        start_page=start_page,
        span=LazySpan(tracing, "search_pages"),
        **options,
    )


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def debug_lines_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]


@pytest.mark.parametrize("prefetch", [True, False])
async def test_pager_ends_when_has_more_is_false(
    caplog: pytest.LogCaptureFixture, prefetch: bool
) -> None:
    service = FakeService(catalogue(7, 3))
    async with make_pager(service.fetch, prefetch=prefetch) as pager:
        pages = [p async for p in pager]
    assert [p.items for p in pages] == [("i0", "i1", "i2"), ("i3", "i4", "i5"), ("i6",)]
    assert service.calls == [1, 2, 3]  # nothing fetched past the last page
    assert pager.next_page is None
    assert pager.total == 7
    assert warnings_of(caplog) == []


async def test_pager_items_mode_yields_the_items_of_every_page() -> None:
    service = FakeService(catalogue(7, 3))
    async with make_pager(service.fetch, mode="items") as pager:
        items = [i async for i in pager]
    assert items == [f"i{k}" for k in range(7)]
    assert service.calls == [1, 2, 3]
    assert pager.next_page is None


async def test_pager_ends_quietly_on_an_empty_page(caplog: pytest.LogCaptureFixture) -> None:
    def page(n: int) -> FakePage:
        return FakePage(n, ("a", "b") if n == 1 else ("c",) if n == 2 else (), more=True)

    service = FakeService(page)
    async with make_pager(service.fetch, mode="items") as pager:
        items = [i async for i in pager]
    assert items == ["a", "b", "c"]
    assert service.calls == [1, 2, 3]
    assert pager.next_page is None
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_pager_stops_with_a_warning_when_a_page_repeats(
    caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    service = FakeService(lambda n: FakePage(n, ("a", "b", "c"), more=True))  # ignores n
    async with asyncio.timeout(5), make_pager(service.fetch, mode=mode) as pager:
        got = [x async for x in pager]
    assert len(got) == (1 if mode == "pages" else 3)  # the repeated page is not yielded
    assert service.calls == [1, 2]
    assert pager.next_page is None
    [warning] = warnings_of(caplog)
    assert "page 2 repeats page 1" in warning


async def test_pager_stops_at_max_pages_with_a_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsearch")
    service = FakeService(endless(3))
    async with make_pager(service.fetch, max_pages=2) as pager:
        pages = [p async for p in pager]
    await asyncio.sleep(0.01)
    assert [p.number for p in pages] == [1, 2]
    assert service.calls == [1, 2]  # no prefetch past the cap
    assert pager.next_page == 3
    # A cap the caller asked for is no warning; it is still said, at DEBUG.
    assert warnings_of(caplog) == []
    [line] = [m for m in debug_lines_of(caplog) if "stopped paging" in m]
    assert "max_pages=2" in line


async def test_max_pages_at_the_natural_end_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = FakeService(catalogue(6, 3))
    async with make_pager(service.fetch, max_pages=2) as pager:
        assert len([p async for p in pager]) == 2
    assert pager.next_page is None
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(
    ("max_items", "calls", "next_page"),
    [(5, [1, 2], 2), (6, [1, 2], 3), (1, [1], 1)],
)
async def test_max_items_yields_exactly_that_many_items_and_fetches_no_more_pages(
    caplog: pytest.LogCaptureFixture, max_items: int, calls: list[int], next_page: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsearch")
    service = FakeService(endless(3))
    async with make_pager(service.fetch, mode="items", max_items=max_items) as pager:
        items = [i async for i in pager]
    await asyncio.sleep(0.01)
    assert len(items) == max_items
    assert service.calls == calls
    assert pager.next_page == next_page  # resuming there misses nothing
    assert warnings_of(caplog) == []
    [line] = [m for m in debug_lines_of(caplog) if "stopped paging" in m]
    assert f"max_items={max_items}" in line


async def test_max_items_at_the_natural_end_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = FakeService(catalogue(6, 3))
    async with make_pager(service.fetch, mode="items", max_items=7) as pager:
        assert len([i async for i in pager]) == 6
    assert pager.next_page is None
    assert warnings_of(caplog) == []


async def test_max_items_in_pages_mode_cuts_the_last_page() -> None:
    service = FakeService(endless(3))
    async with make_pager(service.fetch, max_items=5) as pager:
        pages = [p async for p in pager]
    assert [len(p.items) for p in pages] == [3, 2]
    assert service.calls == [1, 2]
    assert pager.next_page == 2


@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_dedupe_drops_items_already_yielded(mode: str) -> None:
    shifting = {
        1: FakePage(1, ("a", "b", "c"), more=True),
        2: FakePage(2, ("c", "d", "e"), more=True),  # "c" shifted onto page 2
        3: FakePage(3, ("d", "e", "f"), more=False),
    }
    service = FakeService(shifting.__getitem__)
    async with make_pager(service.fetch, mode=mode, dedupe=True) as pager:
        got = [x async for x in pager]
    if mode == "pages":
        assert [p.items for p in got] == [("a", "b", "c"), ("d", "e"), ("f",)]
    else:
        assert got == ["a", "b", "c", "d", "e", "f"]

    service = FakeService(shifting.__getitem__)
    async with make_pager(service.fetch, mode="items") as pager:
        assert [x async for x in pager] == ["a", "b", "c", "c", "d", "e", "d", "e", "f"]


async def test_dedupe_skips_a_page_of_duplicates_but_not_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cycle = [("a", "b"), ("c", "d")]
    service = FakeService(lambda n: FakePage(n, cycle[(n - 1) % 2], more=True))
    async with asyncio.timeout(5), make_pager(service.fetch, mode="items", dedupe=True) as pager:
        items = [i async for i in pager]
    assert items == ["a", "b", "c", "d"]
    assert service.calls == [1, 2, 3, 4, 5]  # three pages in a row brought nothing new
    assert pager.next_page is None
    [warning] = warnings_of(caplog)
    assert "nothing new" in warning


async def test_a_walk_resumes_from_next_page() -> None:
    service = FakeService(catalogue(14, 3))
    async with make_pager(service.fetch, mode="items", max_items=7) as first:
        seen = [i async for i in first]
    assert first.next_page == 3
    async with make_pager(service.fetch, mode="items", start_page=first.next_page) as second:
        rest = [i async for i in second]
    everything = [f"i{k}" for k in range(14)]
    assert set(seen) | set(rest) == set(everything)  # nothing missed
    assert seen + rest[1:] == everything  # only what was handed out of the cut page comes again


async def test_next_page_in_items_mode_points_at_the_first_item_not_handed_out() -> None:
    service = FakeService(catalogue(9, 3))
    pager = make_pager(service.fetch, mode="items")
    assert pager.next_page == 1
    async with pager:
        assert [await anext(pager) for _ in range(2)] == ["i0", "i1"]
        assert pager.next_page == 1
        assert await anext(pager) == "i2"
        assert pager.next_page == 2


async def test_pager_tracks_the_last_total() -> None:
    totals = {1: 40, 2: 42, 3: 41}
    service = FakeService(lambda n: FakePage(n, (f"p{n}",), more=n < 3, total=totals[n]))
    pager = make_pager(service.fetch)
    seen = [pager.total]
    async with pager:
        async for _ in pager:
            seen.append(pager.total)
    assert seen == [None, 40, 42, 41]  # the spec makes total part of every page


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_a_fetch_error_ends_the_walk_and_keeps_next_page(prefetch: bool, mode: str) -> None:
    def page(n: int) -> FakePage:
        if n == 3:
            raise Boom("page 3 is down")
        return FakePage(n, (f"p{n}",), more=True)

    service = FakeService(page)
    got = []
    async with make_pager(service.fetch, mode=mode, prefetch=prefetch) as pager:
        got.append(await anext(pager))
        got.append(await anext(pager))
        await asyncio.sleep(0.02)  # with prefetch, page 3 has failed by now: not raised early
        assert service.calls == ([1, 2, 3] if prefetch else [1, 2])
        with pytest.raises(Boom, match="page 3 is down"):
            await anext(pager)
        assert pager.next_page == 3
        with pytest.raises(StopAsyncIteration):
            await anext(pager)
    assert len(got) == 2
    assert service.calls == [1, 2, 3]


async def test_a_failed_prefetch_that_is_never_asked_for_is_not_reported() -> None:
    def page(n: int) -> FakePage:
        if n == 2:
            raise Boom("never asked for")
        return FakePage(n, ("a",), more=True)

    service = FakeService(page)
    async with make_pager(service.fetch) as pager:
        await anext(pager)
        await asyncio.sleep(0.02)
    assert service.calls == [1, 2]
    # the no_loop_errors fixture checks that no "exception was never retrieved" was logged


@pytest.mark.parametrize("prefetch", [True, False])
async def test_prefetch_sends_the_next_request_while_the_caller_works(prefetch: bool) -> None:
    events: list[tuple[str, int]] = []

    async def fetch(n: int) -> FakePage:
        events.append(("start", n))
        await asyncio.sleep(0)  # like taking a pooled connection before writing the request
        events.append(("sent", n))
        await asyncio.sleep(0.02)  # the network
        return FakePage(n, (f"p{n}",), more=n < 4)

    async for page in make_pager(fetch, prefetch=prefetch):
        time.sleep(0.02)  # noqa: ASYNC251 - CPU-bound work that never yields to the loop
        events.append(("worked", page.number))

    for n in (1, 2, 3):
        sent_next = events.index(("sent", n + 1))
        worked = events.index(("worked", n))
        if prefetch:
            assert sent_next < worked  # the request was on the wire during the caller's work
        else:
            assert sent_next > worked
    assert ("start", 5) not in events


@dataclasses.dataclass(frozen=True)
class PaddedPage(FakePage):
    """A page whose body also carries ``padding`` bytes in a field a page does not read."""

    padding: int = 0

    def body(self, *, hits_first: bool = False) -> bytes:
        page = super().body(hits_first=hits_first)
        return page[:-1] + b',"padding":"' + b"p" * self.padding + b'"}'


@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_a_finished_walk_kept_holds_no_bytes_of_its_last_page(mode: str) -> None:
    """A pager kept once its walk has ended (for ``next_page``, ``total``) keeps no page's
    body: nothing as large as the last page's body is left allocated."""
    size = 2_000_000
    service = FakeService(lambda n: PaddedPage(n, (f"i{n}",), n < 2, total=2, padding=size))
    tracing = tracemalloc.is_tracing()  # already, with PYTHONTRACEMALLOC: then left on
    if not tracing:
        tracemalloc.start()
    try:
        before = _snapshot()
        pager = make_pager(service.fetch, mode=mode)
        assert len([item async for item in pager]) == 2
        gc.collect()
        after = _snapshot()
    finally:
        if not tracing:
            tracemalloc.stop()
    assert service.calls == [1, 2]
    assert pager.next_page is None  # kept, and still answering
    left = [diff.size_diff for diff in after.compare_to(before, "traceback")]
    assert [grown for grown in left if grown >= size] == []


def _snapshot() -> tracemalloc.Snapshot:
    """What is allocated, but for tracemalloc's own snapshots."""
    own = tracemalloc.Filter(False, tracemalloc.__file__)
    return tracemalloc.take_snapshot().filter_traces([own])


@pytest.mark.parametrize("how", WAYS_OUT)
async def test_pager_every_way_out_leaves_nothing_running(how: str) -> None:
    before = other_tasks()
    calls: list[int] = []
    cancelled: list[int] = []
    finite = how == "exhausted"

    async def fetch(n: int) -> FakePage:
        calls.append(n)
        if finite or n == 1:
            await asyncio.sleep(0)
            return FakePage(n, (f"p{n}",), more=n < 3)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        raise AssertionError("unreachable")

    def make() -> Walk:
        return make_pager(fetch)

    if how == "exhausted":
        assert len([p async for p in make()]) == 3
    elif how == "aclose":
        pager = make()
        await anext(pager)
        await pager.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(pager)
        assert pager.next_page == 2
    elif how == "async_with":
        async with make() as pager:
            async for _ in pager:
                break
    elif how == "body_exception":

        async def consume() -> None:
            async for _ in make():  # no async with: only the finaliser can clean up
                raise Boom

        with pytest.raises(Boom):
            await consume()
        await turns()
    elif how in ("cancelled_in_anext", "cancelled_in_body"):
        got_first = asyncio.Event()

        async def consume() -> None:
            async for _ in make():
                got_first.set()
                if how == "cancelled_in_body":
                    await asyncio.sleep(3600)

        task = asyncio.create_task(consume())
        await got_first.wait()
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        if how == "cancelled_in_body":
            await turns()
    elif how == "anyio_timeout":
        # The deadline passes once the first result is in (the rest under way), not after a
        # wall-clock time the machine may need just to start them.
        with anyio.move_on_after(3600) as scope:
            async for _ in make():
                scope.deadline = anyio.current_time()
        assert scope.cancelled_caught
    elif how == "break":
        async for _ in make():
            break
        await turns()
    else:  # pragma: no cover
        raise AssertionError(how)

    assert other_tasks() == before
    if finite:
        assert calls == [1, 2, 3]
    else:
        assert calls == [1, 2]
        assert cancelled == [2]  # the pending prefetch was cancelled
    await asyncio.sleep(0.02)
    assert calls == ([1, 2, 3] if finite else [1, 2])


async def test_pager_cleanup_completes_inside_a_cancelled_anyio_scope() -> None:
    before = other_tasks()
    cleaned: list[int] = []

    async def fetch(n: int) -> FakePage:
        if n > 1:
            scope.deadline = anyio.current_time()  # page 2 is under way: time is up
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(0.02)  # cleanup that awaits, like closing a connection
                cleaned.append(n)
                raise
        return FakePage(n, (f"p{n}",), more=True)

    with anyio.move_on_after(3600) as scope:
        async for _ in make_pager(fetch):
            pass
    assert scope.cancelled_caught
    assert cleaned == [2]
    assert other_tasks() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_pages": 0}, "max_pages"),
        ({"max_pages": True}, "max_pages"),
        ({"max_items": -1}, "max_items"),
        ({"max_items": 2.0}, "max_items"),
    ],
)
async def test_pager_validates_its_caps(kwargs: dict[str, Any], message: str) -> None:
    service = FakeService(endless(2))
    with pytest.raises(InvalidRequestError, match=message):
        make_pager(service.fetch, **kwargs)
    assert service.calls == []


async def test_dedupe_and_max_items_together_in_items_mode() -> None:
    service = FakeService(catalogue(4, 2))
    async with make_pager(service.fetch, mode="items", dedupe=True, max_items=3) as pager:
        assert [i async for i in pager] == ["i0", "i1", "i2"]


async def test_pager_aclose_from_another_task_ends_the_iteration() -> None:
    service = FakeService(endless(1), latency=3600)
    pager = make_pager(service.fetch)
    waiter = asyncio.ensure_future(anext(pager))
    await asyncio.sleep(0.01)
    await pager.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 5)
    assert service.calls == [1]


async def test_pager_refuses_two_concurrent_consumers() -> None:
    service = FakeService(endless(1), latency=3600)
    async with make_pager(service.fetch) as pager:
        first = asyncio.ensure_future(anext(pager))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already being iterated"):
            await anext(pager)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
