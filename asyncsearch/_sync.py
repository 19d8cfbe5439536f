"""``SearchClient``: the blocking twin of ``AsyncSearchClient``, a facade over it.

One event loop in one daemon thread of the client's own (``asyncsearch.SearchClient.loop``)
runs an ``AsyncSearchClient``; each blocking call hands its coroutine to that loop and waits for
it. Nothing of the service is implemented twice: every method is the async one, run there.

How a call crosses threads: ``loop.call_soon_threadsafe`` starts it as a task named
``asyncsearch.SearchClient.call`` and a ``concurrent.futures.Future`` carries its outcome back,
as ``asyncio.run_coroutine_threadsafe`` does, plus the task's name and its cancellation on
Ctrl-C. The loop's handle copies the caller's ``contextvars``, so the task runs in them (a span
active in the caller's thread parents the call's). anyio's ``BlockingPortal`` does the same
through a task group of its own at 2.4-3x the cost per call (``benchmarks.sync``: a trivial
call takes 27-32 µs this way, 77-95 µs through the portal, on a 2-core Xeon), so it is not used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as futures
import functools
import inspect
import os
import queue
import threading
import warnings
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator
from contextlib import suppress
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, Unpack, cast, overload

from ._call import APIResponse
from ._client import AsyncSearchClient, ExtractionResults, Id, JobId
from ._client import ExtractionResult as Result
from ._config import OptionChanges
from ._errors import ClientClosedError, ConfigurationError, EventLoopMismatchError
from ._paging import SearchPager

P = ParamSpec("P")
T = TypeVar("T")
Y = TypeVar("Y")

_END: Any = object()
#: Ids in memory: reading them runs none of the caller's code, so the loop reads them itself (a
#: single str or bytes too, which the bulk call refuses).
_IN_MEMORY = (list, tuple, range, set, frozenset, str, bytes, bytearray, memoryview)

#: The parent's loops and clients, in a forked child: kept there, never closed nor collected.
_forsaken: list[object] = []
_runners: weakref.WeakSet[_Runner] = weakref.WeakSet()


def _forked() -> None:
    for runner in list(_runners):  # the parent's loop is left alone: new ones on first use
        _forsaken.append((runner.running, runner.client))
        runner.lock, runner.running, runner.client = threading.Lock(), None, runner.make()


os.register_at_fork(after_in_child=_forked)


class _Runner:
    """The loop thread of a ``SearchClient`` and its copies, and the ``AsyncSearchClient`` that
    owns their pool. Neither refers to a ``SearchClient``, so an unclosed one is collected."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.make = functools.partial(AsyncSearchClient, *args, **kwargs)
        self.client = self.make()  # raises in the caller's thread
        self.lock, self.closed = threading.Lock(), False
        self.running: tuple[Any, ...] | None = None  # the loop, its thread, the stop future
        self.readers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        _runners.add(self)

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run ``call`` on the loop (started now if need be) and wait for its outcome; a wait
        interrupted (Ctrl-C) cancels the call there, and waits for that, first."""
        future: futures.Future[T] = futures.Future()
        with self.lock:
            if self.running is None and not self.closed:
                new = asyncio.new_event_loop()
                stop = new.create_future()
                thread = threading.Thread(target=self._serve, args=(new, stop), daemon=True)
                thread.name = "asyncsearch.SearchClient.loop"  # a daemon: never holds up exit
                self.running = new, thread, stop
                thread.start()
            loop, thread = self.running[:2] if self.running else (None, None)
            if self.closed or loop is None or threading.current_thread() is thread:
                call.close()  # never started
                if self.closed:
                    raise ClientClosedError("the client is closed")
                raise EventLoopMismatchError("a SearchClient called on its own loop waits forever")
            loop.call_soon_threadsafe(_start, call, future)
        try:
            return future.result()
        finally:
            if not future.done():  # interrupted (Ctrl-C): cancelled there, and waited for
                loop.call_soon_threadsafe(lambda: future.task.cancel())  # type: ignore[attr-defined]
                futures.wait([future])

    def _serve(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Future[None]) -> None:
        # Runner.close() then cancels what is left, closes async generators (the ids read by
        # _read_ids) and the loop's executor (aiohttp's DNS lookups), and the loop.
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(self._main(stop))

    async def _main(self, stop: asyncio.Future[None]) -> None:
        asyncio.current_task().set_name("asyncsearch.SearchClient.main")  # type: ignore[union-attr]
        try:
            await stop
        finally:
            await self.client.aclose()

    def close(self, *, wait: bool = True) -> None:
        """Close the client on its loop, cancel what is left there, end the threads (a reader
        of ids still inside the caller's iterable after a second ends when that returns)."""
        with self.lock:
            closed, self.closed, running = self.closed, True, self.running
        if not closed and running is not None:
            running[0].call_soon_threadsafe(running[2].set_result, None)  # loop, stop: see run()
            for started in [running[1], *self.readers] if wait else ():
                started.join(None if started is running[1] else 1.0)


def _start(call: Coroutine[Any, Any, Any], future: futures.Future[Any]) -> None:
    future.task = task = asyncio.create_task(call, name="asyncsearch.SearchClient.call")  # type: ignore[attr-defined]
    task.add_done_callback(functools.partial(_settle, future))


def _settle(future: futures.Future[Any], task: asyncio.Task[Any]) -> None:
    closed = task.cancelled()  # by close(), or by Ctrl-C (its waiter is gone)
    error = ClientClosedError("the client was closed mid-call") if closed else task.exception()
    future.set_result(task.result()) if error is None else future.set_exception(error)


async def _read_ids(ids: Iterator[Id], runner: _Runner) -> AsyncIterator[Id]:
    """``ids`` read in a thread of their own, one ahead of the bulk call that takes them: a
    generator or a file may block, and on the loop thread it would stall every call."""
    asks: queue.SimpleQueue[futures.Future[Any] | None] = queue.SimpleQueue()

    def read() -> None:  # until the bulk call stops asking (None) or gives up (cancelled)
        while (asked := asks.get()) is not None and asked.set_running_or_notify_cancel():
            try:
                asked.set_result(next(ids, _END))
            except Exception as exc:
                asked.set_exception(exc)

    reader = threading.Thread(target=read, name="asyncsearch.SearchClient.ids", daemon=True)
    runner.readers.add(reader)
    reader.start()
    asks.put(asked := futures.Future[Any]())
    try:
        while (item := await asyncio.wrap_future(asked)) is not _END:
            asks.put(asked := futures.Future())
            yield item
    finally:
        asks.put(None)


class _Blocking(Generic[P, T]):
    """The blocking twin of a coroutine method of ``AsyncSearchClient``: its parameters, its
    result. Read on a ``SyncRawResponseClient``, an endpoint's ``APIResponse`` instead."""

    @overload
    def __init__(
        self: _Blocking[P, T],
        method: Callable[Concatenate[AsyncSearchClient, P], Coroutine[Any, Any, T]],
    ) -> None: ...
    @overload
    def __init__(
        self: _Blocking[P, SyncSearchPager[Y]],
        method: Callable[Concatenate[AsyncSearchClient, P], SearchPager[Y]],
    ) -> None: ...
    @overload
    def __init__(
        self: _Blocking[P, SyncExtractionResults[Id]],
        method: Callable[Concatenate[AsyncSearchClient, P], ExtractionResults[Id]],
    ) -> None: ...

    def __init__(self, method: Callable[..., Any]) -> None:
        ids = "job_ids" in inspect.signature(method).parameters  # read off the loop: _ids
        raw_method = getattr(method, "raw", method)  # an endpoint's (_client._Endpoint)

        def call(facade: Any, /, *a: Any, **k: Any) -> Any:
            client: SearchClient = getattr(facade, "_client", facade)  # a raw client's
            if ids:
                a, k = client._ids(*a, **k)
            made = (method if client is facade else raw_method)(client._ready(), *a, **k)
            walk = _WALKS.get(type(made))  # search_pages, search_hits, iter_extractions
            return client._runner.run(made) if walk is None else walk(client, made)

        self.call = functools.update_wrapper(call, method)
        functools.update_wrapper(self, method)  # type: ignore[arg-type]  # for help()

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: SearchClient, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, instance: SyncRawResponseClient, owner: type[Any]
    ) -> Callable[P, APIResponse[T]]: ...

    def __get__(self, instance: object, owner: type[Any]) -> Any:
        return self if instance is None else MethodType(self.call, instance)


def _parameters_of(
    init: Callable[Concatenate[Any, P], None],
) -> Callable[[Callable[..., None]], Callable[Concatenate[SearchClient, P], None]]:
    """Give ``SearchClient.__init__`` the parameters of ``init`` (type checkers, ``help()``)."""
    return functools.partial(functools.update_wrapper, wrapped=init)


class _Closing:
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()  # type: ignore[attr-defined]


class SearchClient(_Closing):
    """A blocking client of the service: ``AsyncSearchClient``'s methods, run on a loop of its own.

    For scripts, notebooks, Django or Flask views and Celery workers. Use it as
    ``with SearchClient(...) as client:`` (or call ``client.close()``); make it once and share it
    across threads. It takes the arguments of ``AsyncSearchClient`` but ``session``, and each
    method takes the parameters of the ``AsyncSearchClient`` method of the same name and returns
    what that one's coroutine returns; pagers and bulk results are plain iterators. Callbacks
    (``on_progress``), a key provider and middlewares run on the client's loop thread
    (``asyncsearch.SearchClient.loop``): they must not block.

    Its methods, each the ``AsyncSearchClient`` method of the same name with its parameters:
    ``search`` (a ``SearchPage``), ``get_extraction`` and ``wait_for_extraction`` (an
    ``ExtractionJob``), ``link_preview``, ``list_webhook_logs``, ``get_webhook_log``,
    ``gather_extractions`` (a list of ``ExtractionResult``), ``search_pages`` and
    ``search_hits`` (a ``SyncSearchPager``), ``iter_extractions`` (a ``SyncExtractionResults``);
    ``with_raw_response`` (a ``SyncRawResponseClient``), ``with_options``, ``close``. Ids of a
    bulk call that are not a list, tuple, set or range are read lazily in a thread of their own
    (``asyncsearch.SearchClient.ids``), never on the loop thread.

    Raises:
        ConfigurationError: for a missing key or URL, invalid options, and for ``session``: an
            aiohttp session belongs to an event loop the caller runs, not to this client's.
    """

    @_parameters_of(AsyncSearchClient.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._closed = self._warned = False
        if kwargs.get("session") is not None:
            raise ConfigurationError("SearchClient runs its own event loop: it takes no session=")
        self._runner = _Runner(args, kwargs)
        self._async = self._base = self._runner.client  # a copy's own (with_options, _inner)
        self._changes: OptionChanges = {}
        self._parent: SearchClient | None = None

    def _ready(self) -> AsyncSearchClient:
        """The ``AsyncSearchClient`` to run a call with, once this thread may wait for one."""
        if self.is_closed:
            raise ClientClosedError("the client is closed")
        own = (self._runner.running or (None,))[0]  # on its own loop run() refuses the call
        # asyncio's public look-up raises when no loop runs here, the usual case: 0.6 µs more a
        # call than its private _get_running_loop, which returns None (of a 27 µs hop). Warned once.
        with suppress(RuntimeError):
            if not self._warned and asyncio.get_running_loop() is not own:
                self._warned = True
                message = "a SearchClient call blocks this thread's running event loop: in "
                warnings.warn(message + "async code use AsyncSearchClient", RuntimeWarning, 3)
        return self._inner()

    def _inner(self) -> AsyncSearchClient:
        """This client's ``AsyncSearchClient``: a copy's is made again after ``os.fork()``."""
        if self._parent is None:
            return self._runner.client
        base = self._parent._inner()
        if base is not self._base:  # the parent's was made again, in a forked child
            self._async, self._base = base.with_options(**self._changes), base
        return self._async

    def _ids(self, job_ids: Iterable[Id] | AsyncIterable[Id], *args: Any, **kwargs: Any) -> Any:
        """A bulk call's arguments, its ``job_ids`` (not in memory) to be read off the loop."""
        if isinstance(job_ids, Iterable) and not isinstance(job_ids, _IN_MEMORY):
            job_ids = _read_ids(iter(job_ids), self._runner)
        return (job_ids, *args), kwargs

    def close(self) -> None:
        """Close the client: its pool on its own loop, then the loop and its thread.

        Calls in flight in other threads end with ``ClientClosedError``, as every later call
        does. Closing a copy made by ``with_options`` leaves the shared pool open. Calling it
        again does nothing.
        """
        if self._parent is None:
            self._runner.close()
        self._closed = True

    @property
    def is_closed(self) -> bool:
        """True once this client, or the client whose pool it shares, was closed."""
        return self._closed or self._runner.closed

    def with_options(self, **changes: Unpack[OptionChanges]) -> SearchClient:
        """A client with some options changed, sharing this one's pool, loop and retry budget.

        Closing it leaves the pool open.

        Args:
            **changes: What ``AsyncSearchClient.with_options`` takes (``OptionChanges``).

        Returns:
            A new client; this one is unchanged.

        Raises:
            ClientClosedError: This client is closed.
            ConfigurationError: An option that is not valid, or one of the pool's.
        """
        child = object.__new__(SearchClient)
        child.__dict__.update(self.__dict__, _parent=self, _changes=changes, _warned=False)
        child._base = self._ready()
        child._async = child._base.with_options(**changes)  # checks them now
        return child

    def __repr__(self) -> str:
        return f"<SearchClient {'closed' if self.is_closed else 'open'}, over {self._inner()!r}>"

    def __del__(self) -> None:
        if getattr(self, "_parent", True) is None and not self.is_closed:
            self._runner.close(wait=False)  # on its own loop: never waited for here
            message = f"unclosed SearchClient over {self._inner()!r}"
            warnings.warn(message, ResourceWarning, stacklevel=2, source=self)

    @property
    def with_raw_response(self) -> SyncRawResponseClient:
        """The same endpoints, returning ``APIResponse`` with status, headers and attempts."""
        return SyncRawResponseClient(self)

    search = _Blocking(AsyncSearchClient.search)
    get_extraction = _Blocking(AsyncSearchClient.get_extraction)
    link_preview = _Blocking(AsyncSearchClient.link_preview)
    list_webhook_logs = _Blocking(AsyncSearchClient.list_webhook_logs)
    get_webhook_log = _Blocking(AsyncSearchClient.get_webhook_log)
    wait_for_extraction = _Blocking(AsyncSearchClient.wait_for_extraction)
    gather_extractions = _Blocking(AsyncSearchClient.gather_extractions)

    search_pages = _Blocking(AsyncSearchClient.search_pages)
    search_hits = _Blocking(AsyncSearchClient.search_hits)
    iter_extractions = _Blocking(AsyncSearchClient.iter_extractions)


class SyncRawResponseClient:
    """The endpoints of a ``SearchClient`` returning ``APIResponse`` (``client.with_raw_response``).

    Each method takes the arguments of the ``RawResponseClient`` method of the same name.

    Args:
        client: The client whose loop runs the calls (made by ``client.with_raw_response``).
    """

    def __init__(self, client: SearchClient) -> None:
        self._client = client

    # SearchClient's twins: read on this client, an endpoint's twin returns its APIResponse.
    search, get_extraction = SearchClient.search, SearchClient.get_extraction
    link_preview, list_webhook_logs = SearchClient.link_preview, SearchClient.list_webhook_logs
    get_webhook_log = SearchClient.get_webhook_log


class _BlockingIterator(_Closing, Iterator[Y]):
    """An async iterator living on the client's loop, read from the caller's thread (``iter()``
    of it is itself: ``Iterator``'s)."""

    def __init__(self, client: SearchClient, walk: SearchPager[Any] | ExtractionResults[Any]):
        self._client, self._walk = client, walk

    def __next__(self) -> Y:
        try:
            return cast(Y, self._client._runner.run(self._walk.__anext__()))
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Stop: cancel the requests in flight on the loop and wait for them; idempotent."""
        if not self._client.is_closed:  # else closing the client ended it
            self._client._runner.run(self._walk.aclose())


class SyncSearchPager(_BlockingIterator[Y]):
    """The iterator of ``SearchClient.search_pages`` (pages) and ``search_hits`` (hits).

    Also a context manager with ``close()``. Leaving it in any way (exhausted, ``close()``,
    ``with``, an exception, a ``break`` that drops it) cancels a pending prefetch on the loop.

    Args:
        client: The client whose loop runs the walk (made by its ``search_pages``).
        walk: The walk, a ``SearchPager`` on that loop.
    """

    _walk: SearchPager[Y]

    @property
    def next_page(self) -> int | None:
        """The page to resume from with ``start_page``; ``None`` once the walk is finished."""
        return self._walk.next_page

    @property
    def total(self) -> int | None:
        """The last total a page reported, or ``None`` before the first page."""
        return self._walk.total


class SyncExtractionResults(_BlockingIterator[Result[JobId]]):
    """The iterator of ``ExtractionResult`` from ``SearchClient.iter_extractions``.

    Also a context manager with ``close()``; leaving early in any way (a ``break`` that drops
    it too) cancels the requests in flight and sends no more.

    Args:
        client: The client whose loop runs the calls (made by its ``iter_extractions``).
        walk: The results, an ``ExtractionResults`` on that loop.
    """


_WALKS: dict[type, Any] = {SearchPager: SyncSearchPager, ExtractionResults: SyncExtractionResults}
