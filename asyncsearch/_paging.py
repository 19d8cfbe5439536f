"""The one page walker: ``SearchPager``, what ``search_pages`` and ``search_hits`` return.

A walk fetches page ``n`` in a task and decides everything on the page itself: the end, the
repeated-page guard, ``dedupe``, the caps. The request for page ``n + 1`` goes out before page
``n`` is decoded: the moment it arrives when the fields before its hits say ``hasMore``
(``search_page_continues``: msgspec, on a compact page in the spec's order), else once
msgspec's view of it (``SearchPageHead``: ``total``, ``hasMore``, the hit ids) has decided.
The client hands in how to build the request of page ``n`` and how to send it; nothing here
imports the client.

Every fetch runs as a named task (``asyncsearch.pager.fetch``, or ``asyncsearch.pager.prefetch``
when it was sent ahead), so that ``aclose()`` from another task and the finaliser of a pager
dropped by a bare ``break`` can cancel it: plain asyncio, no task group kept open across the
caller's loop body.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, Self, TypeVar, cast

import msgspec

from . import _concurrency as concurrency
from . import _protocol as protocol
from . import _tracing as tracing
from ._checks import check_number, running_loop
from ._errors import ResponseValidationError
from ._models import SearchPage, SearchPageHead, own_text
from ._protocol import Request
from ._tracing import CallSpan, LazySpan

Y = TypeVar("Y")

logger = logging.getLogger("asyncsearch")

# Event-loop turns given to a prefetch task before the current page is decoded and handed over.
# A task that is only created sends nothing until the loop runs it; if the caller then blocks
# the loop, the prefetch gains nothing. One turn is enough for aiohttp on a pooled connection;
# the rest is headroom for the awaits of the client's send (retry bookkeeping, the pool).
_PREFETCH_HEAD_START_TURNS = 3

# With dedupe, this many pages in a row with nothing new end the walk: a service that cycles
# through the same pages would otherwise be fetched forever without yielding anything.
_MAX_STALE_PAGES = 3

# Said at DEBUG, not WARNING, when a cap ends the walk: the caller asked for the cap.
_CAPPED = "stopped paging at %s=%d; more results remain (resume with start_page=%s)"


class Answer(tracing.Answer, Protocol):
    """What the client's send gives back for one page: what a span reads, the body, its decode."""

    @property
    def content(self) -> bytes: ...

    def parse(self) -> SearchPage: ...


#: What a walk decides on: a page's view, or the page (the same fields).
Head = SearchPageHead | SearchPage


def _read_head(answer: Answer) -> SearchPageHead:
    try:
        return protocol.search_page_head(answer.content)
    except ResponseValidationError:
        # Raise the full decode's error instead: it names SearchPage and the attempts, and keeps
        # the key out of the body. (The view's fields are the page's: if one fails, both do.)
        answer.parse()
        raise


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A prefetched page that fails is raised when the caller asks for it; if the caller never
    # does (it stopped early), the error is moot and must not be logged as "never retrieved".
    if not task.cancelled():
        task.exception()


class SearchPager(concurrency.AsyncClosing, Generic[Y]):
    """An async iterator over search pages (``search_pages``) or hits (``search_hits``).

    Also an async context manager with ``aclose()``. ``next_page`` is the page to resume from
    with ``start_page=`` (``None`` once the walk is finished) and ``total`` the last total seen.
    Leaving it in any way (exhausted, ``aclose``, ``async with``, an exception, cancellation, a
    bare ``break``) cancels a pending prefetch and sends nothing more.
    """

    def __init__(
        self,
        page_request: Callable[[int], Request[Any]],
        send: Callable[[Request[Any], CallSpan], Awaitable[Answer]],  # under the page's span
        *,
        items: bool,
        start_page: int,
        max_pages: int | None,
        max_items: int | None,
        prefetch: bool,
        dedupe: bool,
        span: LazySpan,
    ) -> None:
        for name, cap in (("max_pages", max_pages), ("max_items", max_items)):
            if cap is not None:
                check_number(name, cap, minimum=1)

        async def receive(number: int) -> tuple[Answer, CallSpan]:
            """Send the request of page ``number``; its span is left open for its hit count."""
            # Not a method: a pending task must not keep the pager alive, or a pager dropped by
            # a bare `break` would never be finalised and its prefetch would run on.
            request = page_request(number)
            with span.child("search", request, {"asyncsearch.search.page": number}) as child:
                child.hold()
                answer = await send(request, child)
                child.answered(answer)
            return answer, child

        self._receive = receive
        self._items = items
        self._max_pages = sys.maxsize if max_pages is None else max_pages
        self._max_items = sys.maxsize if max_items is None else max_items
        self._prefetch = bool(prefetch)
        self._span = span
        self._next_fetch: int | None = start_page  # the page to fetch next; None past the end
        self._resume: int | None = start_page  # see next_page
        self._total: int | None = None
        self._pages_fetched = 0
        self._accepted = 0  # hits taken for handing out (after dedupe and the max_items cut)
        self._cut = False  # the last page taken was cut short by max_items
        self._previous_ids: list[str] | None = None
        self._seen: set[str] | None = set() if dedupe else None  # ids taken; None: no dedupe
        self._stale_pages = 0
        self._buffer: deque[Any] = deque()  # what is left to hand out of the current page
        self._buffer_page = start_page
        self._pending: asyncio.Task[tuple[Answer, CallSpan]] | None = None
        # The body of the page before stays referenced until the next one is read. Freed at
        # once, a multi-MB body is handed back to the OS by glibc's allocator and faulted back
        # in for the next read (measured: ~4x the minor page faults, 2-4 ms more system CPU).
        self._held = b""
        self._done = False
        self._running = False

    @property
    def next_page(self) -> int | None:
        """The page to resume from with ``start_page`` so that nothing not yet handed out is missed.

        For pages: the next page to fetch. For hits: the page of the first hit not yet handed
        out (after ``max_items`` cut a page, or a ``break`` in the middle of a page, a resumed
        walk starts with that page again). After an error: the page that failed. ``None`` once
        the walk has reached the end of the results.
        """
        return self._resume

    @property
    def total(self) -> int | None:
        """The last total a page reported, or ``None`` before the first page."""
        return self._total

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Y:
        if self._done:
            raise StopAsyncIteration
        if self._running:
            raise RuntimeError("this pager is already being iterated by another task")
        self._running = True
        try:
            while not self._buffer:
                self._buffer_page, page = await self._take()
                self._buffer.extend(page.hits if self._items else (page,))
            item = self._buffer.popleft()
            if self._items:
                own_text(item)  # a hit kept does not keep its page's body
            if not self._buffer:
                self._resume = self._buffer_page if self._cut else self._next_fetch
            return cast(Y, item)
        except BaseException as exc:
            # Whatever escapes ends the walk: the end, an error, the caller's cancellation.
            await self._end(None if isinstance(exc, StopAsyncIteration) else exc)
            raise
        finally:
            self._running = False

    async def _take(self) -> tuple[int, SearchPage]:
        """The next page with hits to hand out, and its number; at the end, StopAsyncIteration."""
        while True:
            number = self._next_fetch
            if self._capped(number) or number is None:
                raise StopAsyncIteration
            answer, span = await self._fetch(number)
            self._pages_fetched += 1
            try:
                if early := self._sends_early(answer.content):
                    # Sent before anything of this page is read; cancelled below if the page
                    # ends the walk after all.
                    await self._send_ahead(number + 1)
                self._held = answer.content
                # The view, to send the next request before the decode; once it is sent, or
                # without prefetch, nothing is gained by it: one read of the body, not two.
                head: Head = _read_head(answer) if self._prefetch and not early else answer.parse()
                span.set("asyncsearch.search.hits", len(head.hits))
            except BaseException as exc:
                span.end(exc)
                raise
            span.end()
            self._total = head.total
            ids = [hit.id for hit in head.hits]
            if not ids or ids == self._previous_ids:
                if ids:
                    logger.warning(
                        "page %d repeats page %d exactly (the service seems to ignore the page "
                        "number); paging stops",
                        number,
                        number - 1,
                    )
                else:
                    logger.debug("page %d is empty; paging ends", number)
                self._next_fetch = self._resume = None
                raise StopAsyncIteration
            self._previous_ids = ids
            self._next_fetch = number + 1 if head.has_more else None
            kept = self._kept(number, ids)  # the positions of the hits to hand out
            more = self._next_fetch is not None and self._room()  # another page is fetched
            if not more:
                await self._stop_pending()  # one sent early for a page the walk does not need
            elif self._prefetch and self._pending is None:
                await self._send_ahead(number + 1)
            if not kept:
                continue
            page = answer.parse()  # the costly part, now that the next request is on the wire
            self._span.event(
                "asyncsearch.page",
                {"asyncsearch.search.page": number, "asyncsearch.search.hits": len(page.hits)},
            )
            if len(kept) < len(ids):
                page = msgspec.structs.replace(page, hits=[page.hits[i] for i in kept])
            return number, page

    def _capped(self, number: int | None) -> bool:
        """Whether a cap the caller asked for ends the walk before page ``number``."""
        if self._accepted >= self._max_items:
            if self._cut or number is not None:
                logger.debug(_CAPPED, "max_items", self._max_items, self._resume)
            return True
        if number is None or self._pages_fetched < self._max_pages:
            return False
        logger.debug(_CAPPED, "max_pages", self._max_pages, number)
        return True

    def _kept(self, number: int, ids: list[str]) -> list[int]:
        """Apply ``dedupe`` and ``max_items`` to a page's hit ids: the positions kept."""
        kept = list(range(len(ids)))
        if self._seen is not None:  # dedupe
            kept = []
            for position, hit_id in enumerate(ids):
                if hit_id not in self._seen:
                    self._seen.add(hit_id)
                    kept.append(position)
            if not kept:
                self._stale_pages += 1
                if self._stale_pages >= _MAX_STALE_PAGES and self._next_fetch is not None:
                    logger.warning(
                        "%d pages in a row up to page %d brought nothing new; paging stops",
                        self._stale_pages,
                        number,
                    )
                    self._next_fetch = None
                else:
                    logger.debug("page %d holds only duplicates; skipped", number)
                self._resume = self._next_fetch
                return kept
            self._stale_pages = 0
        room = self._max_items - self._accepted
        self._cut = len(kept) > room
        self._accepted += min(len(kept), room)
        return kept[:room]

    def _sends_early(self, body: bytes) -> bool:
        """Whether the next page is wanted whatever else this page holds, as far as known.

        Known when the page's first bytes say ``hasMore`` and that it has hits, and no cap,
        ``dedupe`` or a repeated page (the same bytes as the one before) could end the walk here.
        """
        size = len(self._previous_ids or ())  # this page's expected size: the last one's
        return (
            self._prefetch
            and self._room(size)
            and (size > 0 or self._max_items == sys.maxsize)
            and (self._seen is None or self._stale_pages + 1 < _MAX_STALE_PAGES)
            and body != self._held
            and protocol.search_page_continues(body)
        )

    def _room(self, items: int = 0) -> bool:
        """Whether the caps leave room for another page, and for ``items`` more hits than that."""
        return self._pages_fetched < self._max_pages and self._accepted + items < self._max_items

    async def _fetch(self, number: int) -> tuple[Answer, CallSpan]:
        # Every fetch runs as a task, prefetched or not, so that aclose() from another task can
        # cancel it; and it is waited for with asyncio.wait, not `await task`, so that such a
        # cancellation reads as the end of the walk here, not as this task being cancelled.
        task = self._pending = self._pending or self._spawn(number, concurrency.PAGER_FETCH_TASK)
        await asyncio.wait({task})
        self._pending = None
        if task.cancelled() and self._done:
            raise StopAsyncIteration
        return task.result()

    def _spawn(self, number: int, name: str) -> asyncio.Task[tuple[Answer, CallSpan]]:
        # Checked before the coroutine is made, so that it is not left never awaited.
        running_loop()
        task = asyncio.create_task(self._receive(number), name=name)
        task.add_done_callback(_retrieve)
        return task

    async def _send_ahead(self, number: int) -> None:
        """Send the request of page ``number`` now, and give it a head start (see the constant)."""
        task = self._pending = self._spawn(number, concurrency.PAGER_PREFETCH_TASK)
        for _ in range(_PREFETCH_HEAD_START_TURNS):
            if not task.done():  # no more turns once it is done
                await asyncio.sleep(0)

    async def _stop_pending(self) -> None:
        """Cancel a pending fetch and wait for it; the span of a page received but unread ends."""
        task, self._pending = self._pending, None
        if task is not None and not task.done():
            task.cancel()
            await concurrency._wait_shielded({task})
        if task is not None and not task.cancelled() and task.exception() is None:
            task.result()[1].end()

    async def _end(self, error: BaseException | None) -> None:
        self._done = True
        self._buffer.clear()
        self._held = b""
        await self._stop_pending()
        self._span.end(error)

    async def aclose(self) -> None:
        """Stop the walk: cancel a pending prefetch and wait for it; idempotent."""
        await self._end(None)

    def __del__(self) -> None:
        # A bare `break` out of `async for` leaves no other chance to stop the prefetch.
        if not hasattr(self, "_done"):
            return  # __init__ raised before setting anything
        if self._pending is not None and not self._done:
            concurrency._cancel_from_finaliser(self._pending)
        self._span.end()
