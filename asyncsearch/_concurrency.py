"""Generic machinery for many calls at once: fan-out, page walking, adaptive limits, retry budgets.

Nothing here knows the search service. The client composes these pieces into its bulk and
paging methods:

- ``fan_out(func, items)`` calls an async function for every item with bounded concurrency and
  bounded memory, yielding one ``Outcome`` per item (errors are captured, never raised).
- ``Pager`` walks any "fetch page n" function, page by page or item by item, prefetching the
  next page while the caller works on the current one, and stops on every way a paged API can
  end (or misbehave).
- ``AdaptiveConcurrency`` is an AIMD limit on calls in flight with a shared pause, for backing off
  when the service says it is overloaded.
- ``RetryBudget`` is a token bucket that caps how much retrying a client may do, in the manner of
  the AWS SDKs' "standard" retry mode.

Everything here lives in one event loop (asyncio; anyio is used only for shielded cleanup) and is
not thread-safe. The iterators clean up on every way out: exhausted, ``aclose()``, ``async with``,
an exception in the loop body, cancellation of the caller, and a bare ``break`` (then the work
is cancelled when the dropped iterator is garbage collected, which CPython does at once, and is
gone a loop turn or two later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Sequence,
    Sized,
)
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, cast, overload

import anyio
import msgspec

from asyncsearch._checks import check_int, running_loop
from asyncsearch._checks import is_int as _is_int
from asyncsearch._checks import running_loop as _require_asyncio
from asyncsearch._errors import ConfigurationError, InvalidRequestError

__all__ = [
    "AdaptiveConcurrency",
    "AsyncClosing",
    "FanOut",
    "Outcome",
    "Pager",
    "RetryBudget",
    "fan_out",
]

T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")
I = TypeVar("I")  # noqa: E741 - the item type of a page, next to P for the page
Y = TypeVar("Y")
V = TypeVar("V")

_LOGGER = logging.getLogger(__name__)

# How many items may be started but not yet handed to the consumer, as a multiple of
# `concurrency`. Unordered: the calls in flight plus as many finished outcomes waiting. Ordered:
# more room, so that one slow item at the head does not stall every other call at once.
_UNORDERED_WINDOW = 2
_ORDERED_WINDOW = 4

# Event-loop turns given to a prefetch task before the current page is handed over. A task that
# is only created sends nothing until the loop runs it; if the caller then does blocking work,
# the prefetch gains nothing. One turn is enough for aiohttp on a pooled connection; the rest
# is headroom for awaits inside the client's fetch function (retry bookkeeping, limiters).
_PREFETCH_HEAD_START_TURNS = 3

# With dedupe, this many pages in a row with nothing new end the walk: a service that cycles
# through the same pages would otherwise be fetched forever without yielding anything.
_MAX_STALE_PAGES = 3

# Names of the tasks this module starts: every task the package creates is named
# "asyncsearch.<what>", so tests and users find them by name, never by a file path (a checkout
# may sit in a folder named like the package, and so may a virtualenv's copy of aiohttp).
FAN_OUT_WORKER_TASK = "asyncsearch.fan_out.worker"
PAGER_FETCH_TASK = "asyncsearch.pager.fetch"
PAGER_PREFETCH_TASK = "asyncsearch.pager.prefetch"


def _cancel_from_finaliser(task: asyncio.Task[Any]) -> None:
    """Cancel a task from ``__del__``, which may run on any thread and after the loop closed."""
    if task.done():
        return
    loop = task.get_loop()
    if loop.is_closed():
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    # A closed loop between the check and the call is not worth a traceback from a finaliser.
    with contextlib.suppress(RuntimeError):
        if running is loop:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)


async def _wait_shielded(tasks: set[asyncio.Task[Any]]) -> None:
    """Wait for already-cancelled tasks to finish, even while the caller is being cancelled."""
    if tasks:
        # Shielded so that an enclosing anyio cancel scope (fail_after, a cancelled task group)
        # does not interrupt the cleanup and leave tasks running behind the caller's back.
        with anyio.CancelScope(shield=True):
            await asyncio.wait(tasks)


# --------------------------------------------------------------------------------------------
# fan_out


def _same_outcome(outcome: Any) -> Any:
    return outcome


class Outcome(msgspec.Struct, Generic[T, R], frozen=True):
    """What one call made by ``fan_out`` came to: its item, and its value or its error.

    ``value`` is the function's return value, or ``None`` when it raised; ``error`` is the exception
    it raised, or ``None``. Only ``Exception`` is captured; cancellation and other
    ``BaseException`` propagate out of the fan-out instead.

    A frozen msgspec Struct (one is made per item): its ``__init__`` costs ~0.15 µs where a
    frozen dataclass's cost ~0.7 µs (timeit). Tracked by the GC, unlike the SDK's results: an
    error's traceback can lead back to it.
    """

    item: T
    value: R | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned instead of raising."""
        return self.error is None


class AsyncClosing:
    """Base of the iterators here: ``async with it:`` closes ``it`` by awaiting ``aclose()``."""

    __slots__ = ()

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def fan_out(
    func: Callable[[T], Awaitable[R]],
    items: Iterable[T] | AsyncIterable[T],
    *,
    concurrency: int = 16,
    ordered: bool = False,
    on_progress: Callable[[int, int | None], object] | None = None,
    stop_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> FanOut[T, R]:
    """Call ``await func(item)`` for every item, at most ``concurrency`` at a time.

    Iterate the result with ``async for`` (ideally inside ``async with``) to receive one
    ``Outcome`` per item. Items are read lazily and memory stays bounded however many there are:
    at most ``concurrency`` calls run at once, and at most ``2 * concurrency`` items
    (``4 * concurrency`` when ``ordered``) are started whose outcomes the consumer has not taken
    yet; a slow consumer therefore holds new calls back. Each occurrence of a duplicate item is
    called once.

    :param func: the async function to call; an ``Exception`` it raises is captured in the
        item's outcome. If it raises ``CancelledError`` (or another ``BaseException``) that
        propagates out of the iteration and the fan-out stops.
    :param items: an iterable or async iterable (a single ``str``, ``bytes``, ``bytearray`` or
        ``memoryview`` is refused: it would be read one character or byte at a time). An async
        iterable is advanced by the fan-out's worker tasks, one at a time; an async iterator with
        ``aclose()`` (an async generator) is closed when the fan-out stops early. An exception
        raised by the items themselves is raised from the iteration after the outcomes of the
        items before it.
    :param ordered: yield outcomes in the order of ``items`` instead of as they complete.
    :param on_progress: called as ``on_progress(done, total)`` each time a call finishes;
        ``total`` is ``len(items)`` when ``items`` has a length, else ``None`` (a generator, an
        iterator, an async iterable; ``done`` still counts every finished call). An exception from
        it is a bug in the caller: it stops the fan-out and is raised from the iteration.
    :param stop_on: exception types that end the whole fan-out instead of becoming an item's
        outcome (say, the client the calls use was closed): the first one raised by ``func``
        stops reading items, cancels the calls in flight and is raised from the iteration.
    :raises InvalidRequestError: at once, before anything starts, for bad arguments.
    """
    check_int("concurrency", concurrency, minimum=1)
    return limited_fan_out(
        func,
        items,
        AdaptiveConcurrency(concurrency),
        ordered=ordered,
        on_progress=on_progress,
        stop_on=stop_on,
    )


def limited_fan_out(
    func: Callable[[T], Awaitable[R]],
    items: Iterable[T] | AsyncIterable[T],
    limit: AdaptiveConcurrency,
    *,
    ordered: bool = False,
    on_progress: Callable[[int, int | None], object] | None = None,
    stop_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> FanOut[T, R]:
    """``fan_out`` with ``limit.maximum`` workers, behind ``limit``: the one gate of each call.

    ``limit`` is the fan-out's own (it also keeps the bound on unconsumed outcomes): one
    per fan-out, never shared.
    """
    if not callable(func):
        raise InvalidRequestError("func must be callable")
    if isinstance(items, str | bytes | bytearray | memoryview):
        # Iterable, but almost always one value passed where many were meant: calling func on
        # every character (or every byte, as an int) would be a silent surprise.
        raise InvalidRequestError(
            f"items must be an iterable of items, not a single {type(items).__name__} "
            "(pass [value] for one item)"
        )
    if not isinstance(items, AsyncIterable | Iterable):
        raise InvalidRequestError(
            f"items must be an iterable or an async iterable, not {type(items).__name__}"
        )
    if on_progress is not None and not callable(on_progress):
        raise InvalidRequestError("on_progress must be callable or None")
    stops = stop_on if isinstance(stop_on, tuple) else (stop_on,)
    if not all(isinstance(kind, type) and issubclass(kind, Exception) for kind in stops):
        raise InvalidRequestError("stop_on must be an exception type or a tuple of them")
    total = len(items) if isinstance(items, Sized) else None
    run = _FanOutRun(
        func,
        items,
        limit,
        ordered=bool(ordered),
        on_progress=on_progress,
        total=total,
        stop_on=stops,
    )
    return FanOut(run)


class _FanOutRun(Generic[T, R]):
    """The running part of a fan-out, shared by its worker tasks.

    It never refers back to its ``FanOut``: that way a ``FanOut`` dropped by a bare ``break`` is
    garbage collected and its finaliser can cancel the workers.
    """

    def __init__(
        self,
        func: Callable[[T], Awaitable[R]],
        items: Iterable[T] | AsyncIterable[T],
        limit: AdaptiveConcurrency,
        *,
        ordered: bool,
        on_progress: Callable[[int, int | None], object] | None,
        total: int | None,
        stop_on: tuple[type[Exception], ...] = (),
    ) -> None:
        self.func = func
        self.stop_on = stop_on
        self.concurrency = limit.maximum
        self.on_progress = on_progress
        self.total = total
        self.ordered = ordered
        # The one gate of every call: the in-flight limit, its pause, the pool slot and the
        # bound on items started and not yet taken by the consumer (the memory bound and, in
        # ordered mode, the reorder window).
        self.limit = limit
        limit.window = limit.maximum * (_ORDERED_WINDOW if ordered else _UNORDERED_WINDOW)
        self.sync_source: Iterator[T] | None = None
        self.async_source: AsyncIterator[T] | None = None
        if isinstance(items, AsyncIterable):
            self.async_source = aiter(items)
        else:
            self.sync_source = iter(items)
        # An async iterator must not be advanced by two workers at once.
        self.pull_lock = asyncio.Lock()
        self.changed = asyncio.Event()
        self.ready: deque[Outcome[T, R]] = deque()
        self.by_index: dict[int, Outcome[T, R]] = {}
        self.head = 0
        self.pulled = 0
        self.done = 0
        self.source_ended = False
        self.source_closed = False
        self.source_error: Exception | None = None
        self.fatal: BaseException | None = None
        self.closing = False
        self.workers: set[asyncio.Task[None]] = set()
        # Set by FanOut._gather: every outcome goes straight to its index here instead of to a
        # consumer woken for each one.
        self.gathered: list[Any] | None = None
        self.keep: Callable[[Outcome[T, R]], Any] = _same_outcome
        self.live = 0  # worker tasks not finished yet
        self.active = 0  # workers that entered their body and have not left it

    def start(self, workers: int) -> None:
        for _ in range(workers):
            task = asyncio.create_task(self.work(), name=FAN_OUT_WORKER_TASK)
            self.workers.add(task)
            self.live += 1
            task.add_done_callback(self.worker_done)

    @property
    def stopping(self) -> bool:
        return self.closing or self.fatal is not None or self.source_ended

    def fail(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
        self.changed.set()

    async def work(self) -> None:
        # The per-item path is written out here rather than split into small methods: it runs
        # once per item of what may be millions, next to a bare loop that pays for none of it.
        self.active += 1
        func = self.func
        limit = self.limit
        stop_on = self.stop_on
        try:
            while not (self.closing or self.fatal is not None or self.source_ended):
                await limit.acquire()
                try:
                    pulled = (
                        self.pull_sync() if self.async_source is None else await self.pull_async()
                    )
                except BaseException:
                    limit.release(taken=True)
                    raise
                if pulled is None:
                    limit.release(taken=True)
                    return
                index, item = pulled
                try:
                    outcome = Outcome(item, await func(item), None)
                except Exception as exc:
                    if stop_on and isinstance(exc, stop_on):
                        self.fail(exc)
                        return
                    outcome = Outcome(item, None, exc)
                finally:
                    limit.release()
                self.finish(index, outcome)
        finally:
            self.active -= 1
            # The last worker out closes the items when the fan-out is being stopped; this is
            # what closes them after a bare `break`, where nobody awaits shutdown().
            if self.active == 0 and self.closing:
                await self.close_source()

    def pull_sync(self) -> tuple[int, T] | None:
        assert self.sync_source is not None
        if self.closing or self.fatal is not None or self.source_ended:  # self.stopping
            return None
        try:
            item = next(self.sync_source)
        except StopIteration:
            self.source_ended = True
            return None
        except Exception as exc:
            self.source_ended = True
            self.source_error = exc
            return None
        index = self.pulled
        self.pulled += 1
        return index, item

    async def pull_async(self) -> tuple[int, T] | None:
        assert self.async_source is not None
        async with self.pull_lock:
            if self.stopping:
                return None
            try:
                item = await anext(self.async_source)
            except StopAsyncIteration:
                self.source_ended = True
                return None
            except Exception as exc:
                self.source_ended = True
                self.source_error = exc
                return None
        index = self.pulled
        self.pulled += 1
        return index, item

    def finish(self, index: int, outcome: Outcome[T, R]) -> None:
        gathered = self.gathered
        if gathered is not None:
            if index >= len(gathered):  # items of unknown number: grow by doubling
                gathered.extend([None] * max(index + 1 - len(gathered), len(gathered)))
            # What is kept is what the caller wants (say, only the value): the Outcome itself
            # is then freed at once, one object fewer per item for the garbage collector.
            gathered[index] = self.keep(outcome)
            # Nobody to wake: _gather waits for the workers to end (worker_done wakes it).
        else:
            if self.ordered:
                self.by_index[index] = outcome
            else:
                self.ready.append(outcome)
            self.changed.set()
        self.done += 1
        if self.on_progress is not None:
            try:
                self.on_progress(self.done, self.total)
            except Exception as exc:
                self.fail(exc)

    def worker_done(self, task: asyncio.Task[None]) -> None:
        self.workers.discard(task)
        self.live -= 1
        self.changed.set()
        if task.cancelled():
            if not self.closing:
                # Nobody but the fan-out cancels its workers, so `func` raised CancelledError
                # itself. Cancellation is never turned into an outcome: it propagates.
                self.fail(asyncio.CancelledError("a call made by fan_out was cancelled"))
            return
        exc = task.exception()  # also marks it retrieved, so asyncio does not log it
        if exc is not None:
            self.fail(exc)

    def take(self) -> Outcome[T, R] | None:
        if self.ordered:
            outcome = self.by_index.pop(self.head, None)
            if outcome is None:
                return None
            self.head += 1
        else:
            if not self.ready:
                return None
            outcome = self.ready.popleft()
        self.limit.taken()
        return outcome

    async def close_source(self) -> None:
        source = self.async_source
        if source is None or self.source_ended or self.source_closed:
            return
        self.source_closed = True
        aclose = getattr(source, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception as exc:
            # The fan-out is over and the caller is leaving with its own outcome; report it the
            # way asyncio reports an async generator whose finaliser failed.
            asyncio.get_running_loop().call_exception_handler(
                {"message": "error while closing the items of fan_out", "exception": exc}
            )

    async def shutdown(self) -> None:
        self.closing = True
        workers = {task for task in self.workers if not task.done()}
        for task in workers:
            task.cancel()
        await _wait_shielded(workers)
        await self.close_source()
        self.ready.clear()
        self.by_index.clear()
        self.changed.set()  # wakes an __anext__ waiting in another task

    def abandon(self) -> None:
        self.closing = True
        for task in list(self.workers):
            _cancel_from_finaliser(task)


class FanOut(AsyncClosing, Generic[T, R]):
    """The async iterator of ``Outcome`` returned by ``fan_out``; also an async context manager.

    Work starts at the first ``__anext__``. Leaving early in any way (``aclose()``, ``async with``,
    an exception, cancellation, ``break``) cancels the calls in flight and starts no more.
    """

    def __init__(self, run: _FanOutRun[T, R]) -> None:
        self._run = run
        self._started = False
        self._finished = False
        self._running = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Outcome[T, R]:
        if self._finished:
            raise StopAsyncIteration
        if self._running:
            raise RuntimeError("this fan-out is already being iterated by another task")
        run = self._run
        if not self._started:
            self._start()
        self._running = True
        try:
            while True:
                if self._finished:  # closed by aclose() from another task
                    raise StopAsyncIteration
                if run.fatal is not None:
                    await self._finish()
                    raise run.fatal
                outcome = run.take()
                if outcome is not None:
                    return outcome
                if run.live == 0:
                    await self._finish()
                    if run.source_error is not None:
                        raise run.source_error
                    raise StopAsyncIteration
                await self._wait_for_change(run)
        finally:
            self._running = False

    async def _wait_for_change(self, run: _FanOutRun[T, R]) -> None:
        run.changed.clear()
        try:
            await run.changed.wait()
        except BaseException:
            # The caller was cancelled: the fan-out ends with it.
            await self._finish()
            raise

    @overload
    async def _gather(self) -> list[Outcome[T, R]]: ...
    @overload
    async def _gather(self, keep: Callable[[Outcome[T, R]], V]) -> list[V]: ...
    async def _gather(self, keep: Callable[[Outcome[T, R]], Any] | None = None) -> list[Any]:
        """Run the whole fan-out and return every outcome in the order of the items.

        With ``keep``, ``keep(outcome)`` is kept and returned for each item instead of the
        outcome, called as each call finishes.

        For a caller that keeps every outcome anyway: the same calls, errors and cleanup as
        iterating to the end, without waking the caller once per outcome and without the
        bound on unconsumed outcomes (they are all kept). Raises what iterating would raise,
        after stopping the fan-out: a fatal error, the items' own error, a cancellation.
        """
        if self._finished or self._started:
            raise RuntimeError("_gather() needs a fan-out that has not started")
        self._running = True
        try:
            run = self._run
            self._start(gathered=True)
            if keep is not None:
                run.keep = keep
            while True:
                if run.fatal is not None:
                    await self._finish()
                    raise run.fatal
                if run.live == 0:
                    break
                await self._wait_for_change(run)
                if self._finished:  # closed by aclose() from another task
                    raise RuntimeError("the fan-out was closed while it was being gathered")
            await self._finish()
            if run.source_error is not None:
                raise run.source_error
            gathered = run.gathered
            assert gathered is not None
            del gathered[run.pulled :]  # the spare room of the last doubling
            if run.done != run.pulled:  # pragma: no cover - every item pulled is finished
                raise RuntimeError("fan_out lost the outcome of an item (a bug in asyncsearch)")
            return gathered
        finally:
            self._running = False

    def _start(self, *, gathered: bool = False) -> None:
        running_loop()  # before any coroutine is made, so none is left never awaited
        run = self._run
        self._started = True
        if gathered:
            run.gathered = [None] * (run.total or 0)
            run.limit.window = None  # every outcome is kept: no bound
        workers = run.concurrency
        if run.total is not None:
            # No point in more workers than items; one still runs to find out the items are empty.
            workers = max(1, min(workers, run.total))
        run.start(workers)

    async def _finish(self) -> None:
        self._finished = True
        if self._started:
            await self._run.shutdown()

    async def aclose(self) -> None:
        """Stop the fan-out: cancel the calls in flight and wait for them; idempotent."""
        await self._finish()

    def __del__(self) -> None:
        # A bare `break` out of `async for` leaves no other chance to stop the workers.
        run = getattr(self, "_run", None)
        if run is not None and self._started and not self._finished:
            run.abandon()


# --------------------------------------------------------------------------------------------
# AdaptiveConcurrency


class AdaptiveConcurrency:
    """An AIMD limit on calls in flight, like TCP's congestion window, plus a shared pause.

    The limit starts at ``maximum``. Each success adds ``increase_step / limit`` (so about
    ``increase_step`` per limit's worth of successes), never above ``maximum``. An overload signal
    (a 429, a 503) multiplies it by ``decrease_factor``, never below ``minimum``, but at most once
    per window: after a cut, the next ``n - 1`` signals (successes or overloads) do not cut again,
    where ``n`` is the number of calls in flight at the cut (or the old limit when no slots are in
    use). Those calls were sent before the cut and report the same congestion, so a burst of 64
    concurrent 429s halves the limit once instead of collapsing it to the minimum.

    ``pause(seconds)`` holds back all new calls until then. Use it from one event loop only.

    It is also the rest of a fan-out's gate, so that a call waits at one place only: ``window``
    bounds the calls started and not yet ``taken()`` by the consumer (``None``: no bound), and
    with a ``pool`` (the transport's semaphore of free connections) a slot also holds one
    connection, taken without a time limit: a bulk call queues for its own pool.

    Private machinery of the client (``maximum`` and ``minimum`` are checked; the factors are
    the caller's to get right).
    """

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        decrease_factor: float = 0.5,
        increase_step: float = 1.0,
        pool: asyncio.Semaphore | None = None,
    ) -> None:
        check_int("maximum", maximum, minimum=1, error=ConfigurationError)
        check_int("minimum", minimum, minimum=1, maximum=maximum, error=ConfigurationError)
        self._maximum = maximum
        self._minimum = minimum
        self._decrease_factor = float(decrease_factor)
        self._increase_step = float(increase_step)
        self._window = float(maximum)
        self._limit = maximum  # max(minimum, int(_window)), kept with _window: read per call
        self._in_flight = 0
        self._paused_until = 0.0  # time.monotonic(), the clock asyncio's loop uses too
        self._ignore_signals = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pool = pool
        self.window: int | None = None
        self._started = 0  # slots taken and not yet taken() by the consumer

    @property
    def maximum(self) -> int:
        """The highest the limit goes."""
        return self._maximum

    @property
    def limit(self) -> int:
        """The current limit on calls in flight."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """The slots held right now."""
        return self._in_flight

    @property
    def paused_for(self) -> float:
        """Seconds until new calls may start again; 0.0 when not paused."""
        return max(0.0, self._paused_until - time.monotonic())

    def on_success(self) -> None:
        """Record a call the service handled: grow the limit additively."""
        if self._ignore_signals > 0:
            self._ignore_signals -= 1
        elif self._window >= self._maximum:
            return  # the usual case in a bulk fetch: nothing to grow, nobody to wake
        before = self.limit
        self._window = min(float(self._maximum), self._window + self._increase_step / self._window)
        self._limit = max(self._minimum, int(self._window))
        if self._limit > before:
            self._wake()

    def on_overload(self) -> None:
        """Record an overload answer (429, 503): shrink the limit, once per window."""
        if self._ignore_signals > 0:
            self._ignore_signals -= 1
            return
        old_limit = self.limit
        generation = self._in_flight if self._in_flight > 0 else old_limit
        self._window = max(float(self._minimum), self._window * self._decrease_factor)
        self._limit = max(self._minimum, int(self._window))
        self._ignore_signals = generation - 1

    def pause(self, seconds: float) -> None:
        """Hold back new calls for ``seconds`` from now; calls already in flight are not touched.

        A longer pause extends the current one, a shorter one never shortens it. A value that is
        not positive does nothing.
        """
        if not seconds > 0:
            return
        until = time.monotonic() + seconds
        if until > self._paused_until:
            self._paused_until = until

    async def acquire(self) -> None:
        """Wait for a slot: until no pause is on and fewer than ``limit`` calls are in flight."""
        loop = running_loop()  # under trio: the typed error every call promises
        woken = False
        while True:
            delay = self._paused_until - time.monotonic()
            if delay > 0:
                # A pause extended meanwhile is seen when the loop checks again.
                await asyncio.sleep(delay)
                continue
            # First come, first served: a newcomer does not take a slot from those in line.
            if self._free() > 0 and (woken or not self._waiters):
                self._in_flight += 1
                self._started += 1
                if self._pool is not None:
                    await self._take_connection(self._pool)
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
                woken = True
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Woken but leaving: hand the wake-up on so that the slot is not lost.
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise

    async def _take_connection(self, pool: asyncio.Semaphore) -> None:
        try:
            await pool.acquire()  # without suspending when a connection is free
        except BaseException:
            self._in_flight -= 1
            self._started -= 1
            self._wake()
            raise

    def release(self, *, taken: bool = False) -> None:
        """Give back a slot taken by ``acquire()``; ``taken``: its outcome needs no room."""
        if self._in_flight <= 0:
            raise RuntimeError("release() called more often than acquire()")
        self._in_flight -= 1
        if self._pool is not None:
            self._pool.release()
        if taken:
            self._started -= 1
        if self._waiters:
            self._wake()

    def taken(self) -> None:
        """Record an outcome the consumer took: room for one more call in the window."""
        self._started -= 1
        if self._waiters:
            self._wake()

    def _free(self) -> int:
        free = self._limit - self._in_flight
        if self.window is not None:
            free = min(free, self.window - self._started)
        return free

    def _wake(self) -> None:
        if not self._waiters:
            return
        free = self._free()
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1


# --------------------------------------------------------------------------------------------
# RetryBudget


class RetryBudget:
    """A token bucket that bounds retries, like the AWS SDKs' "standard" retry mode.

    It starts full with ``capacity`` tokens. Each retry takes ``retry_cost`` tokens
    (``timeout_retry_cost`` after a timeout); when too few are left the retry is refused, so a
    failing service sees the retry rate drop to a trickle instead of multiplying its load. Each
    success puts ``success_refund`` back, up to ``capacity``. With the defaults, 100 retries in a
    row empty the bucket and 5 successes earn one retry back. Use it from one event loop only.

    :raises ConfigurationError: for a value that is not a non-negative integer.
    """

    def __init__(
        self,
        capacity: int = 500,
        *,
        retry_cost: int = 5,
        timeout_retry_cost: int = 10,
        success_refund: int = 1,
    ) -> None:
        for name, value in (
            ("capacity", capacity),
            ("retry_cost", retry_cost),
            ("timeout_retry_cost", timeout_retry_cost),
            ("success_refund", success_refund),
        ):
            check_int(name, value, minimum=0, error=ConfigurationError)
        self._capacity = capacity
        self._retry_cost = retry_cost
        self._timeout_retry_cost = timeout_retry_cost
        self._success_refund = success_refund
        self._tokens = capacity

    @property
    def capacity(self) -> int:
        """The most tokens the bucket holds (and the number it starts with)."""
        return self._capacity

    @property
    def tokens(self) -> int:
        """The tokens left."""
        return self._tokens

    def try_acquire(self, *, after_timeout: bool = False) -> bool:
        """Take the cost of one retry and return True, or return False and take nothing."""
        cost = self._timeout_retry_cost if after_timeout else self._retry_cost
        if cost > self._tokens:
            return False
        self._tokens -= cost
        return True

    def on_success(self) -> None:
        """Record a success: refund ``success_refund`` tokens, never above ``capacity``."""
        if self._tokens < self._capacity:  # a full bucket, the usual case, stays as it is
            self._tokens = min(self._capacity, self._tokens + self._success_refund)

    def __repr__(self) -> str:
        return f"RetryBudget(tokens={self._tokens}, capacity={self._capacity})"


# --------------------------------------------------------------------------------------------
# Pager


async def _fetch_one(fetch_page: Callable[[int], Awaitable[P]], page: int) -> P:
    return await fetch_page(page)


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A prefetched page that fails is raised when the caller asks for it; if the caller never
    # does (it stopped early), the error is moot and must not be logged as "never retrieved".
    # (The error stays in the task: task.result() still raises it.)
    if not task.cancelled():
        task.exception()


class Pager(AsyncClosing, Generic[Y]):
    """Walk a paged API through any "fetch page n" function: page by page or item by item.

    Use it with ``async for`` (ideally inside ``async with``). With ``mode="pages"`` it yields the
    pages, with ``mode="items"`` the items of each page in turn. The walk ends quietly when
    ``has_more(page)`` is false or a page has no items; it also ends, with one WARNING on
    ``logger``, when a page repeats the previous page's items exactly (a service that ignores the
    page number; that page is not yielded) and, with ``dedupe``, after several pages in a row that
    bring nothing new. When ``max_pages`` or ``max_items`` (caps the caller asked for) cut a walk
    that had more to give, it ends with one DEBUG line saying where to resume.

    With ``prefetch`` (the default) the next page is requested while the caller works on the
    current one, and the request is given a head start of a few event-loop turns before the
    current page is handed over, so that it is on the wire even if the caller then blocks the
    loop. No page past the known end or past a cap is fetched. A failed prefetch is raised only
    when the caller asks for that page.

    An exception from ``fetch_page`` (or from the callbacks) ends the walk and propagates.

    :param fetch_page: ``await fetch_page(n)`` returns page ``n``.
    :param mode: ``"pages"`` or ``"items"``.
    :param start_page: the first page to fetch; pass a previous walk's ``next_page`` to resume.
    :param page_items: the items of a page.
    :param item_key: a hashable identity of an item, to detect repeated pages and duplicates.
    :param has_more: whether the service says there are pages after this one.
    :param page_total: the total the page reports (kept in ``total``), or ``None``.
    :param replace_items: a copy of a page holding other items; needed in pages mode with
        ``dedupe`` or ``max_items``, to drop duplicates or cut the last page.
    :param max_pages: fetch at most this many pages.
    :param max_items: yield at most exactly this many items (in pages mode, the last page is cut).
    :param dedupe: drop items already yielded earlier in this walk (results shift while an index
        changes); a page left empty is skipped.
    :param logger: where the WARNING and DEBUG lines go.
    :param decode_page: for pages that are costly to decode, a pipelined walk. ``fetch_page``
        then returns the page *as received* (cheap to read: typically the body plus a view
        that skipped the costly parts), from which ``page_items``, ``item_key``, ``has_more``
        and ``page_total`` decide everything the walk decides (the end, the guards, dedupe,
        caps); the request for the next page is sent, and given its head start, *before*
        ``decode_page(received)`` makes the page that is handed out, so the decoding overlaps
        the next round trip. ``page_items`` of the decoded page must list the same items in the
        same order. An error from ``decode_page`` ends the walk like a fetch error (the next
        request, already sent, is cancelled). Without ``prefetch`` it changes nothing but
        where the decoding happens.
    :param peek: with ``decode_page``, a look at the received page that costs next to nothing
        (not even the view): ``True`` when the walk certainly goes on after it, ``False`` when
        it certainly ends, ``None`` when it cannot tell. On ``True`` the request for the next
        page is sent the moment the page is received, before anything of it is read, unless a
        decision about this page could still end the walk before it: ``max_pages`` reached,
        ``max_items`` within one ``page_size`` (or no ``page_size``), the last stale page
        ``dedupe`` allows. The page is then decoded and everything is decided on the decoded
        page as usual; if it ends the walk after all (the service ignored the page number and
        repeated the page, a page held only duplicates once too often, or the page was larger
        than ``page_size`` and reached ``max_items``), the request sent ahead is cancelled and
        never becomes a page, but it may have reached the service. On ``False`` the page is
        decoded at once (nothing can overlap it) and decided on; on ``None``, or on ``True``
        when it may not send ahead, the walk proceeds as without ``peek``.
    :param page_size: the most items a page holds (the page size the fetch asks for), so that
        ``peek`` can send ahead in a walk with ``max_items`` while the cap is more than a page
        away.
    :raises InvalidRequestError: for bad arguments, at construction.
    """

    @overload
    def __init__(
        self: Pager[P],
        fetch_page: Callable[[int], Awaitable[P]],
        *,
        mode: Literal["pages"],
        start_page: int,
        page_items: Callable[[P], Sequence[I]],
        item_key: Callable[[I], Hashable],
        has_more: Callable[[P], bool],
        page_total: Callable[[P], int | None] | None = None,
        replace_items: Callable[[P, list[I]], P] | None = None,
        max_pages: int | None = None,
        max_items: int | None = None,
        prefetch: bool = True,
        dedupe: bool = False,
        logger: logging.Logger | None = None,
        decode_page: Callable[[Any], P] | None = None,
        peek: Callable[[Any], bool | None] | None = None,
        page_size: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: Pager[I],
        fetch_page: Callable[[int], Awaitable[P]],
        *,
        mode: Literal["items"],
        start_page: int,
        page_items: Callable[[P], Sequence[I]],
        item_key: Callable[[I], Hashable],
        has_more: Callable[[P], bool],
        page_total: Callable[[P], int | None] | None = None,
        replace_items: Callable[[P, list[I]], P] | None = None,
        max_pages: int | None = None,
        max_items: int | None = None,
        prefetch: bool = True,
        dedupe: bool = False,
        logger: logging.Logger | None = None,
        decode_page: Callable[[Any], P] | None = None,
        peek: Callable[[Any], bool | None] | None = None,
        page_size: int | None = None,
    ) -> None: ...

    def __init__(
        self,
        fetch_page: Callable[[int], Awaitable[Any]],
        *,
        mode: Literal["pages", "items"],
        start_page: int,
        page_items: Callable[[Any], Sequence[Any]],
        item_key: Callable[[Any], Hashable],
        has_more: Callable[[Any], bool],
        page_total: Callable[[Any], int | None] | None = None,
        replace_items: Callable[[Any, list[Any]], Any] | None = None,
        max_pages: int | None = None,
        max_items: int | None = None,
        prefetch: bool = True,
        dedupe: bool = False,
        logger: logging.Logger | None = None,
        decode_page: Callable[[Any], Any] | None = None,
        peek: Callable[[Any], bool | None] | None = None,
        page_size: int | None = None,
    ) -> None:
        for name, func in (
            ("fetch_page", fetch_page),
            ("page_items", page_items),
            ("item_key", item_key),
            ("has_more", has_more),
        ):
            if not callable(func):
                raise InvalidRequestError(f"{name} must be callable")
        for name, optional in (
            ("page_total", page_total),
            ("replace_items", replace_items),
            ("decode_page", decode_page),
            ("peek", peek),
        ):
            if optional is not None and not callable(optional):
                raise InvalidRequestError(f"{name} must be callable or None")
        if mode not in ("pages", "items"):
            raise InvalidRequestError(f"mode must be 'pages' or 'items', not {mode!r}")
        if not _is_int(start_page):
            raise InvalidRequestError(f"start_page must be an integer, not {start_page!r}")
        for name, cap in (("max_pages", max_pages), ("max_items", max_items)):
            if cap is not None and (not _is_int(cap) or cap < 1):
                raise InvalidRequestError(f"{name} must be an integer >= 1 or None, not {cap!r}")
        if peek is not None and decode_page is None:
            raise InvalidRequestError("peek reads received pages: it needs decode_page")
        if page_size is not None and (not _is_int(page_size) or page_size < 1):
            raise InvalidRequestError(
                f"page_size must be an integer >= 1 or None, not {page_size!r}"
            )
        if mode == "pages" and replace_items is None and (dedupe or max_items is not None):
            raise InvalidRequestError(
                "replace_items is needed to walk pages with dedupe or max_items"
            )
        self._fetch_page = fetch_page
        self._items_mode = mode == "items"
        self._page_items = page_items
        self._item_key = item_key
        self._has_more = has_more
        self._page_total = page_total
        self._replace_items = replace_items
        self._max_pages = max_pages
        self._max_items = max_items
        self._prefetch = bool(prefetch)
        self._dedupe = bool(dedupe)
        self._logger = logger if logger is not None else _LOGGER
        self._decode_page = decode_page
        self._peek = peek
        self._page_size = page_size

        self._next_fetch: int | None = start_page  # the page to fetch next; None past the end
        self._resume: int | None = start_page  # see next_page
        self._total: int | None = None
        self._pages_fetched = 0
        self._accepted = 0  # items taken for handing out (after dedupe and the max_items cut)
        self._cut = False  # the last page taken was cut short by max_items
        self._previous_keys: list[Hashable] | None = None
        self._seen: set[Hashable] = set()
        self._stale_pages = 0
        self._buffer: deque[Any] = deque()  # items mode: the items of the current page left
        self._buffer_page = start_page
        self._pending: asyncio.Task[Any] | None = None  # the prefetch of page _next_fetch
        self._done = False
        self._running = False

    @property
    def next_page(self) -> int | None:
        """The page to resume from with ``start_page`` so that nothing not yet handed out is missed.

        In pages mode: the next page to fetch. In items mode: the page of the first item not yet
        handed out (so after ``max_items`` cut a page, or after a ``break`` in the middle of a
        page, a resumed walk starts with that page again). After an error: the page that failed.
        ``None`` once the walk has reached the end of the results.
        """
        return self._resume

    @property
    def total(self) -> int | None:
        """The last total a page reported, or ``None`` before the first page (or if none did)."""
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
            if self._items_mode:
                while not self._buffer:
                    taken = await self._take_page()
                    if taken is None:
                        raise StopAsyncIteration
                    page_no, _, fresh = taken
                    self._buffer.extend(fresh)
                    self._buffer_page = page_no
                item = self._buffer.popleft()
                if not self._buffer:
                    self._resume = self._buffer_page if self._cut else self._next_fetch
                return cast(Y, item)
            taken = await self._take_page()
            if taken is None:
                raise StopAsyncIteration
            page_no, page, _ = taken
            self._resume = page_no if self._cut else self._next_fetch
            return cast(Y, page)
        except BaseException:
            # Whatever escapes ends the walk: the end, an error, the caller's cancellation.
            await self._end()
            raise
        finally:
            self._running = False

    async def _take_page(self) -> tuple[int, Any, list[Any]] | None:
        """Fetch pages until one has items to hand out; None when the walk is over."""
        taken = await self._take_decided_page()
        if self._pending is not None and (taken is None or not self._wants_more()):
            # A request sent ahead on peek's word, for a page the walk turned out not to need.
            await self._drop_pending()
        return taken

    async def _take_decided_page(self) -> tuple[int, Any, list[Any]] | None:
        while True:
            if self._max_items is not None and self._accepted >= self._max_items:
                if self._cut or self._next_fetch is not None:
                    # DEBUG, not WARNING: the caller asked for this cap.
                    self._logger.debug(
                        "stopped paging at max_items=%d; more results remain "
                        "(resume with start_page=%s)",
                        self._max_items,
                        self._resume,
                    )
                return None
            page_no = self._next_fetch
            if page_no is None:
                return None
            if self._max_pages is not None and self._pages_fetched >= self._max_pages:
                self._logger.debug(
                    "stopped paging at max_pages=%d; more results remain "
                    "(resume with start_page=%d)",
                    self._max_pages,
                    page_no,
                )
                return None

            page = await self._fetch(page_no)
            self._pages_fetched += 1
            decoded = self._decode_page is None
            if not decoded and self._peek is not None:
                assert self._decode_page is not None
                hint = self._peek(page)
                if hint and self._prefetch and self._may_send_early():
                    # The page says there is more before a byte of it is read: the next request
                    # goes out now, overlapping the whole decode (_take_page cancels it if the
                    # decoded page ends the walk after all).
                    self._pending = self._spawn(page_no + 1, PAGER_PREFETCH_TASK)
                    await self._head_start()
                    page = self._decode_page(page)
                    decoded = True
                elif hint is False:
                    # The walk ends here: nothing to overlap, so no view either.
                    page = self._decode_page(page)
                    decoded = True
                # Otherwise the view decides, and the next request goes out before the decode.
            items = list(self._page_items(page))
            if self._page_total is not None:
                total = self._page_total(page)
                if total is not None:
                    self._total = total
            if not items:
                self._logger.debug("page %d is empty; paging ends", page_no)
                self._next_fetch = self._resume = None
                return None
            keys = [self._item_key(item) for item in items]
            if keys == self._previous_keys:
                self._logger.warning(
                    "page %d repeats page %d exactly (the service seems to ignore the page "
                    "number); paging stops",
                    page_no,
                    page_no - 1,
                )
                self._next_fetch = self._resume = None
                return None
            self._previous_keys = keys
            self._next_fetch = page_no + 1 if self._has_more(page) else None

            # Positions in the page of the items to hand out, or None for all of them: with
            # decode_page the decisions are made on the received page and applied to the
            # decoded one.
            kept: list[int] | None = None
            if self._dedupe:
                kept = []
                for position, key in enumerate(keys):
                    if key not in self._seen:
                        self._seen.add(key)
                        kept.append(position)
                if not kept:
                    self._stale_pages += 1
                    if self._stale_pages >= _MAX_STALE_PAGES and self._next_fetch is not None:
                        self._logger.warning(
                            "%d pages in a row up to page %d brought nothing new; paging stops",
                            self._stale_pages,
                            page_no,
                        )
                        self._next_fetch = self._resume = None
                        return None
                    self._logger.debug("page %d holds only duplicates; skipped", page_no)
                    self._resume = self._next_fetch
                    continue
                self._stale_pages = 0
                if len(kept) == len(keys):
                    kept = None
            self._cut = False
            count = len(items) if kept is None else len(kept)
            if self._max_items is not None:
                room = self._max_items - self._accepted
                if count > room:
                    kept = list(range(room)) if kept is None else kept[:room]
                    count = room
                    self._cut = True
            self._accepted += count
            if self._pending is None:
                self._start_prefetch()
                await self._head_start()
            if not decoded:
                assert self._decode_page is not None
                # The costly part, now that the next request is on the wire.
                page = self._decode_page(page)
                items = list(self._page_items(page))
                if len(items) != len(keys):
                    raise RuntimeError(
                        f"decode_page gave page {page_no} with {len(items)} items, "
                        f"the received page had {len(keys)}"
                    )
            if kept is None:
                return page_no, page, items
            fresh = [items[position] for position in kept]
            if not self._items_mode:
                assert self._replace_items is not None  # checked in __init__
                page = self._replace_items(page, fresh)
            return page_no, page, fresh

    async def _fetch(self, page_no: int) -> Any:
        # Every fetch runs as a task, prefetched or not, so that aclose() from another task can
        # cancel it; and it is waited for with asyncio.wait, not `await task`, so that such a
        # cancellation reads as the end of the walk here, not as this task being cancelled.
        task = self._pending
        if task is None:
            task = self._pending = self._spawn(page_no, PAGER_FETCH_TASK)
        await asyncio.wait({task})
        self._pending = None
        if task.cancelled() and self._done:
            raise StopAsyncIteration
        return task.result()

    def _spawn(self, page_no: int, name: str) -> asyncio.Task[Any]:
        _require_asyncio()  # before the coroutine is made, so it is not left never awaited
        task = asyncio.create_task(_fetch_one(self._fetch_page, page_no), name=name)
        task.add_done_callback(_retrieve)
        return task

    def _wants_more(self) -> bool:
        """Whether the walk, as decided so far, fetches another page."""
        return (
            self._next_fetch is not None
            and (self._max_pages is None or self._pages_fetched < self._max_pages)
            and (self._max_items is None or self._accepted < self._max_items)
        )

    def _may_send_early(self) -> bool:
        """Whether no decision about the page just received can end the walk before the next."""
        if self._max_pages is not None and self._pages_fetched >= self._max_pages:
            return False
        if self._max_items is not None and (
            self._page_size is None or self._accepted + self._page_size >= self._max_items
        ):
            return False
        return not (self._dedupe and self._stale_pages + 1 >= _MAX_STALE_PAGES)

    def _start_prefetch(self) -> None:
        if self._prefetch and self._wants_more():
            assert self._next_fetch is not None
            self._pending = self._spawn(self._next_fetch, PAGER_PREFETCH_TASK)

    async def _drop_pending(self) -> None:
        task, self._pending = self._pending, None
        if task is not None and not task.done():
            task.cancel()
            await _wait_shielded({task})

    async def _head_start(self) -> None:
        task = self._pending
        if task is None:
            return
        for _ in range(_PREFETCH_HEAD_START_TURNS):
            if task.done():
                return
            await asyncio.sleep(0)

    async def _end(self) -> None:
        self._done = True
        task, self._pending = self._pending, None
        self._buffer.clear()
        if task is not None and not task.done():
            task.cancel()
            await _wait_shielded({task})

    async def aclose(self) -> None:
        """Stop the walk: cancel a pending prefetch and wait for it; idempotent."""
        await self._end()

    def __del__(self) -> None:
        # A bare `break` out of `async for` leaves no other chance to stop the prefetch.
        # (getattr: __init__ may have raised before setting anything.)
        task = getattr(self, "_pending", None)
        if task is not None and not self._done:
            _cancel_from_finaliser(task)
