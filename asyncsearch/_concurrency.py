"""Generic machinery for many calls at once: fan-out, adaptive limits, retry budgets.

Nothing here knows the search service. The client composes these pieces into its bulk and
paging methods:

- ``fan_out(func, items)`` calls an async function for every item with bounded concurrency and
  bounded memory, yielding one ``Outcome`` per item (errors are captured, never raised).
- ``Slots`` is a number of slots taken first come, first served (the transport's pool of
  connections is one); ``AdaptiveConcurrency`` is one whose number moves: an AIMD limit on
  calls in flight with a shared pause, for backing off when the service says it is overloaded.
- ``RetryBudget`` is a token bucket that caps how much retrying a client may do, in the manner of
  the AWS SDKs' "standard" retry mode.
- ``RateLimit`` is a token bucket of requests per second that every request on the wire takes
  one from.

Everything here lives in one event loop and is not thread-safe. Time is anyio's (its clock, its
sleep, its shielded scope for cleanup), as in the rest of the core; tasks, futures and events are
asyncio's, which anyio's own are built on (a waiter here is one future, nothing more).

The iterators clean up on every way out: exhausted, ``aclose()``, ``async with``,
an exception in the loop body, cancellation of the caller, and a bare ``break`` (then the work
is cancelled when the dropped iterator is garbage collected, which CPython does at once, and is
gone a loop turn or two later).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sized
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, cast

import anyio
import msgspec

from asyncsearch._checks import check_number, check_positive, running_loop
from asyncsearch._errors import ConfigurationError, InvalidRequestError

T = TypeVar("T")
R = TypeVar("R")
V = TypeVar("V")

# How many items may be started but not yet handed to the consumer, as a multiple of
# `concurrency`. Unordered: the calls in flight plus as many finished outcomes waiting. Ordered:
# more room, so that one slow item at the head does not stall every other call at once.
_UNORDERED_WINDOW = 2
_ORDERED_WINDOW = 4

# Names of the tasks this module starts: every task the package creates is named
# "asyncsearch.<what>", so tests and users find them by name, never by a file path (a checkout
# may sit in a folder named like the package, and so may a virtualenv's copy of aiohttp).
FAN_OUT_WORKER_TASK = "asyncsearch.fan_out.worker"
PAGER_FETCH_TASK = "asyncsearch.pager.fetch"
PAGER_PREFETCH_TASK = "asyncsearch.pager.prefetch"


def _cancel_from_finaliser(task: asyncio.Task[Any]) -> None:
    """Cancel a task from ``__del__``, which may run on any thread and after the loop closed."""
    loop = task.get_loop()
    with contextlib.suppress(RuntimeError):  # no loop runs in this thread
        if asyncio.get_running_loop() is loop:
            task.cancel()
            return
    # A loop closed by now (RuntimeError) is not worth a traceback from a finaliser.
    with contextlib.suppress(RuntimeError):
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

    Args:
        func: The async function to call; an ``Exception`` it raises is captured in the
            item's outcome. If it raises ``CancelledError`` (or another ``BaseException``) that
            propagates out of the iteration and the fan-out stops.
        items: An iterable or async iterable (a single ``str``, ``bytes``, ``bytearray`` or
            ``memoryview`` is refused: it would be read one character or byte at a time). An
            async iterable is advanced by the fan-out's worker tasks, one at a time; an async
            iterator with ``aclose()`` (an async generator) is closed when the fan-out stops
            early. An exception raised by the items themselves is raised from the iteration
            after the outcomes of the items before it.
        concurrency: The most calls running at once.
        ordered: Yield outcomes in the order of ``items`` instead of as they complete.
        on_progress: Called as ``on_progress(done, total)`` each time a call finishes;
            ``total`` is ``len(items)`` when ``items`` has a length, else ``None`` (a generator,
            an iterator, an async iterable; ``done`` still counts every finished call). An
            exception from it is a bug in the caller: it stops the fan-out and is raised from
            the iteration.
        stop_on: Exception types that end the whole fan-out instead of becoming an item's
            outcome (say, the client the calls use was closed): the first one raised by
            ``func`` stops reading items, cancels the calls in flight and is raised from the
            iteration.

    Returns:
        The outcomes, as an async iterator and context manager; nothing starts before the
        first ``__anext__``.

    Raises:
        InvalidRequestError: At once, before anything starts, for bad arguments.
    """
    check_number("concurrency", concurrency, minimum=1)
    limit = AdaptiveConcurrency(concurrency)
    return limited_fan_out(
        func, items, limit, ordered=ordered, on_progress=on_progress, stop_on=stop_on
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
    check_items(items)
    if on_progress is not None and not callable(on_progress):
        raise InvalidRequestError("on_progress must be callable or None")
    stops = stop_on if isinstance(stop_on, tuple) else (stop_on,)
    if not all(isinstance(kind, type) and issubclass(kind, Exception) for kind in stops):
        raise InvalidRequestError("stop_on must be an exception type or a tuple of them")
    return FanOut(_FanOutRun(func, items, limit, bool(ordered), on_progress, stops))


def check_items(items: object, name: str = "items") -> None:
    """Refuse, with ``InvalidRequestError``, what is not many items: above all a single one."""
    # A str or bytes is iterable, but almost always one value passed where many were meant:
    # calling func on every character (or every byte, as an int) would be a silent surprise.
    single = isinstance(items, str | bytes | bytearray | memoryview)
    if single or not isinstance(items, AsyncIterable | Iterable):
        raise InvalidRequestError(
            f"{name} must be an iterable or an async iterable (a list, a set, a generator), not "
            f"a single {type(items).__name__}: put one in a list ([value])"
        )


async def _async_items(items: Iterable[T]) -> AsyncIterator[T]:
    # One way to read items of both kinds: a plain iterable is read through this (measured:
    # ~0.2 µs an item, next to the ~150 µs of CPU a call through the client costs).
    for item in items:
        yield item


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
        ordered: bool,
        on_progress: Callable[[int, int | None], object] | None,
        stop_on: tuple[type[Exception], ...],
    ) -> None:
        self.func = func
        self.stop_on = stop_on
        self.on_progress = on_progress
        self.total = len(items) if isinstance(items, Sized) else None
        self.ordered = ordered
        # The one gate of every call: the in-flight limit, its pause and the bound on items
        # started and not yet taken by the consumer (the memory bound and, in ordered mode, the
        # reorder window). It counts calls; connections are the transport's pool's own.
        self.limit = limit
        limit.window = limit.maximum * (_ORDERED_WINDOW if ordered else _UNORDERED_WINDOW)
        # Async items must not be advanced by two workers at once; plain items are read through
        # _async_items without the lock (a bulk call's list of ids: no cost per item).
        self.source = aiter(items) if isinstance(items, AsyncIterable) else _async_items(items)
        self.pull_lock = asyncio.Lock() if isinstance(items, AsyncIterable) else None
        self.changed = asyncio.Event()
        self.ready: deque[Outcome[T, R]] = deque()
        self.by_index: dict[int, Outcome[T, R]] = {}
        self.head = 0
        self.pulled = 0
        self.done = 0
        self.source_ended = False  # also once the fan-out closed them
        self.source_error: Exception | None = None
        self.fatal: BaseException | None = None
        self.started = False
        self.running = False  # a consumer is in FanOut.__anext__
        self.closing = False
        self.workers: set[asyncio.Task[None]] = set()
        # Set by FanOut._gather: every outcome, as `keep` makes it, goes straight to its index
        # here instead of to a consumer woken for each one.
        self.gathered: list[Any] | None = None
        self.keep: Callable[[Outcome[T, R]], Any] = _same_outcome
        self.values = False  # set by FanOut._gather: a value is kept as func returned it
        self.active = 0  # workers that entered their body and have not left it

    def start(self, *, gathered: bool = False) -> None:
        running_loop()  # before any coroutine is made, so none is left never awaited
        self.started = True
        if gathered:
            self.gathered = [None] * (self.total or 0)
            self.limit.window = sys.maxsize  # every outcome is kept: no bound
        workers = self.limit.maximum
        if self.total is not None:
            # No point in more workers than items; one still runs to find out the items are empty.
            workers = max(1, min(workers, self.total))
        for _ in range(workers):
            task = asyncio.create_task(self.work(), name=FAN_OUT_WORKER_TASK)
            self.workers.add(task)
            task.add_done_callback(self.worker_done)

    def fail(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
        self.changed.set()

    async def work(self) -> None:
        # The per-item path is kept to few calls (only pull() is one of its own): it runs once
        # per item of what may be millions, next to a bare loop that pays for none of it.
        self.active += 1
        func = self.func
        limit = self.limit
        stop_on = self.stop_on
        try:
            while not (self.closing or self.fatal is not None or self.source_ended):
                # The slot first, then the item: in ordered mode the item due next always has a
                # slot. A worker waiting for its item holds only that slot of its own fan-out,
                # nothing another call needs (a connection is taken inside each attempt).
                if not limit.take():
                    await limit.acquire()
                pulled = await self.pull()
                if pulled is None:
                    return
                index, item = pulled
                kept = self.values
                outcome: Any
                try:
                    # Gathered with values kept, a value needs no Outcome around it: one object
                    # fewer per item (the outcome of a failure is still made and kept).
                    outcome = await func(item)
                    if not kept:
                        outcome = Outcome(item, outcome, None)
                except Exception as exc:
                    if stop_on and isinstance(exc, stop_on):
                        self.fail(exc)
                        return
                    outcome, kept = Outcome(item, None, exc), False
                finally:
                    limit.release()
                self.finish(index, outcome, kept=kept)
        finally:
            self.active -= 1
            # The last worker out closes the items when the fan-out is being stopped; this is
            # what closes them after a bare `break`, where nobody awaits shutdown().
            if self.active == 0 and self.closing:
                await self.close_source()

    async def pull(self) -> tuple[int, T] | None:
        """The next item and its index; or None, and the slot of the gate is given back."""
        lock = self.pull_lock
        try:
            if lock is not None:
                await lock.acquire()
            try:
                if not (self.closing or self.fatal is not None or self.source_ended):
                    item = await anext(self.source)
                    self.pulled += 1
                    return self.pulled - 1, item
            finally:
                if lock is not None:
                    lock.release()
        except Exception as exc:  # StopAsyncIteration too: the items ran out
            self.source_ended = True
            self.source_error = None if isinstance(exc, StopAsyncIteration) else exc
        except BaseException:
            self.limit.release(taken=True)
            raise
        self.limit.release(taken=True)
        return None

    def finish(self, index: int, outcome: Any, *, kept: bool = False) -> None:
        """Record the ``outcome`` of item ``index`` (with ``kept``, a value to keep as it is)."""
        gathered = self.gathered
        if gathered is not None:
            if index >= len(gathered):  # items of unknown number: grow by doubling
                gathered.extend([None] * max(index + 1 - len(gathered), len(gathered)))
            # What is kept is what the caller wants (say, only the value): the Outcome itself
            # is then freed at once, one object fewer per item for the garbage collector.
            gathered[index] = outcome if kept else self.keep(outcome)
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
        self.changed.set()
        if task.cancelled():
            if not self.closing:
                # Nobody but the fan-out cancels its workers, so `func` raised CancelledError
                # itself. Cancellation is never turned into an outcome: it propagates.
                self.fail(asyncio.CancelledError("a call made by fan_out was cancelled"))
        elif (exc := task.exception()) is not None:  # also marks it retrieved: no asyncio log
            self.fail(exc)

    def take(self) -> Outcome[T, R] | None:
        if self.ordered:
            outcome = self.by_index.pop(self.head, None)
        else:
            outcome = self.ready.popleft() if self.ready else None
        if outcome is not None:
            self.head += 1  # the index due next, in order (unused otherwise)
            self.limit.taken()
        return outcome

    async def close_source(self) -> None:
        aclose = None if self.source_ended else getattr(self.source, "aclose", None)
        self.source_ended = True  # closed once, by the last worker out or by shutdown()
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
        if not self.started:
            return  # the items were never read: they are the caller's to close
        workers = {task for task in self.workers if not task.done()}
        for task in workers:
            task.cancel()
        await _wait_shielded(workers)
        await self.close_source()
        self.ready.clear()
        self.by_index.clear()
        self.changed.set()  # wakes an __anext__ waiting in another task


class FanOut(AsyncClosing, Generic[T, R]):
    """The async iterator of ``Outcome`` returned by ``fan_out``; also an async context manager.

    Work starts at the first ``__anext__``. Leaving early in any way (``aclose()``, ``async with``,
    an exception, cancellation, ``break``) cancels the calls in flight and starts no more.
    """

    def __init__(self, run: _FanOutRun[T, R]) -> None:
        self._run = run

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Outcome[T, R]:
        if self._run.closing:
            raise StopAsyncIteration
        run = self._run  # (after the check: mypy would take run.closing for False below)
        if run.running:
            raise RuntimeError("this fan-out is already being iterated by another task")
        if not run.started:
            run.start()
        run.running = True
        try:
            while True:
                if run.closing:  # closed by aclose() from another task
                    if run.gathered is not None:
                        raise RuntimeError("the fan-out was closed while it was being gathered")
                    raise StopAsyncIteration
                outcome = None if run.fatal is not None else run.take()
                if outcome is not None:
                    return outcome
                if run.fatal is not None or not run.workers:
                    raise run.fatal or run.source_error or StopAsyncIteration()
                run.changed.clear()
                await run.changed.wait()
        except BaseException:
            # Whatever escapes ends the fan-out: its end, an error, the caller's cancellation.
            await run.shutdown()
            raise
        finally:
            run.running = False

    async def _gather(
        self, keep: Callable[[Outcome[T, R]], V] = _same_outcome, *, values: bool = False
    ) -> list[V]:
        """Run the whole fan-out and return every outcome in the order of the items.

        With ``keep``, ``keep(outcome)`` is kept and returned for each item instead of the
        outcome, called as each call finishes; with ``values`` too, a call's return value is
        kept as it is (``keep`` then sees failures only).

        For a caller that keeps every outcome anyway: the same calls, errors and cleanup as
        iterating to the end, without waking the caller once per outcome and without the
        bound on unconsumed outcomes (they are all kept). Raises what iterating would raise,
        after stopping the fan-out: a fatal error, the items' own error, a cancellation.
        """
        run = self._run
        if run.started or run.closing:
            raise RuntimeError("_gather() needs a fan-out that has not started")
        run.keep = keep
        run.values = values
        run.start(gathered=True)
        with contextlib.suppress(StopAsyncIteration):
            await self.__anext__()  # hands out nothing: every outcome goes to run.gathered
        gathered = cast(list[V], run.gathered)
        del gathered[run.pulled :]  # the spare room of the last doubling
        return gathered

    async def aclose(self) -> None:
        """Stop the fan-out: cancel the calls in flight and wait for them; idempotent."""
        await self._run.shutdown()

    def __del__(self) -> None:
        # A bare `break` out of `async for` leaves no other chance to stop the workers (after
        # aclose() or the end, none is left).
        self._run.closing = True
        for task in list(self._run.workers):
            _cancel_from_finaliser(task)


# --------------------------------------------------------------------------------------------
# Slots and AdaptiveConcurrency


class Slots:
    """A number of slots, taken first come, first served: ``take()`` one that is free now, else
    ``await acquire()`` one; ``release()`` gives it back.

    A slot given back goes straight to the task first in line, counted for it before it wakes,
    so that a task arriving meanwhile never takes it first; a task cancelled as it is handed one
    hands it on. ``close(error)`` ends every wait with ``error()``. The transport's pool of
    connections is one; ``AdaptiveConcurrency`` is one whose number of slots moves. Use it from
    one event loop only.
    """

    def __init__(self, size: int) -> None:
        self.limit = size  # how many slots there are: read per call
        self.in_flight = 0  # slots held right now
        # asyncio futures, not anyio events: a wake-up carries "you have it" or the error of
        # close(), and a waiter woken while it is being cancelled hands its slot on.
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _free(self) -> int:
        return self.limit - self.in_flight

    def take(self) -> bool:
        """Take a slot if one is free now and nobody waits for one (the usual case): no await."""
        # Inline, not _free(): this runs once per request.
        if self._waiters or self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    async def acquire(self) -> None:
        """Wait in line for a slot: the one to call after ``take()`` found none."""
        waiter = running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                Slots.release(self)  # handed one as it stopped waiting: on to the next in line
            else:
                with contextlib.suppress(ValueError):  # still in line
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give back a slot: to the task first in line, if one waits."""
        if self.in_flight <= 0:
            raise RuntimeError("a slot was given back more often than taken")
        self.in_flight -= 1
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        """Hand the free slots to the tasks first in line."""
        free = self._free()
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)
                free -= 1

    def close(self, error: Callable[[], BaseException]) -> None:
        """End every wait with an ``error()`` of its own."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error())


class AdaptiveConcurrency(Slots):
    """An AIMD limit on calls in flight, like TCP's congestion window, plus a shared pause.

    The limit starts at ``maximum``. Each success adds ``increase_step / limit`` (so about
    ``increase_step`` per limit's worth of successes), never above ``maximum``. An overload signal
    (a 429, a 503) multiplies it by ``decrease_factor``, never below ``minimum``, but at most once
    per window: after a cut, the next ``n - 1`` signals (successes or overloads) do not cut again,
    where ``n`` is the number of calls in flight at the cut (or the old limit when no slots are in
    use). Those calls were sent before the cut and report the same congestion, so a burst of 64
    concurrent 429s halves the limit once instead of collapsing it to the minimum.

    ``pause(seconds)`` holds back all new calls until then. Use it from one event loop only.

    It is also the rest of a fan-out's gate: ``window`` bounds the calls started and not yet
    ``taken()`` by the consumer (``sys.maxsize``: no bound). It counts calls only: it never holds
    a connection (a call takes one of the transport's pool inside each attempt).

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
    ) -> None:
        check_number("maximum", maximum, minimum=1, error=ConfigurationError)
        check_number("minimum", minimum, minimum=1, maximum=maximum, error=ConfigurationError)
        super().__init__(maximum)  # the limit on calls in flight: int(_window), kept with it
        self.maximum = maximum  # the highest the limit goes
        self._minimum = minimum
        self._decrease_factor = float(decrease_factor)
        self._increase_step = float(increase_step)
        self._window = float(maximum)
        self._paused_until = 0.0  # in anyio's clock (the loop's)
        self._ignore_signals = 0
        self.window = sys.maxsize  # no bound unless a fan-out sets one
        self._unconsumed = 0  # calls given back whose outcome the consumer has not taken()

    @property
    def paused_for(self) -> float:
        """Seconds until new calls may start again; 0.0 when not paused."""
        return max(0.0, self._paused_until - anyio.current_time()) if self._paused_until else 0.0

    def on_success(self) -> None:
        """Record a call the service handled: grow the limit additively."""
        if self._ignore_signals > 0:
            self._ignore_signals -= 1
        elif self._window >= self.maximum:
            return  # the usual case in a bulk fetch: nothing to grow, nobody to wake
        self._window = min(float(self.maximum), self._window + self._increase_step / self._window)
        self.limit = int(self._window)  # never below minimum: on_overload keeps _window above it
        self._wake()  # hands out nothing unless the limit grew

    def on_overload(self) -> None:
        """Record an overload answer (429, 503): shrink the limit, once per window."""
        if self._ignore_signals > 0:
            self._ignore_signals -= 1
            return
        self._ignore_signals = (self.in_flight or self.limit) - 1
        self._window = max(float(self._minimum), self._window * self._decrease_factor)
        self.limit = int(self._window)

    def pause(self, seconds: float) -> None:
        """Hold back new calls for ``seconds`` from now; calls already in flight are not touched.

        A longer pause extends the current one, a shorter one never shortens it. A value that is
        not positive does nothing.
        """
        if seconds > 0:
            self._paused_until = max(self._paused_until, anyio.current_time() + seconds)

    async def acquire(self) -> None:
        """Wait for a slot: until no pause is on and fewer than ``limit`` calls are in flight."""
        running_loop()  # under trio: the typed error every call promises
        await self._pause_over()
        if not self.take():
            await super().acquire()
            try:
                await self._pause_over()  # one that began while it waited in line
            except BaseException:
                self.release(taken=True)
                raise

    async def _pause_over(self) -> None:
        while self._paused_until:  # read per call: the clock only while a pause may be on
            if (delay := self._paused_until - anyio.current_time()) > 0:
                await anyio.sleep(delay)  # a pause extended meanwhile is seen next time round
            else:
                self._paused_until = 0.0

    def take(self) -> bool:
        """Take a slot if no pause is on, one is free now and nobody waits for one: no await."""
        if self._paused_until or self._waiters or self._free() <= 0:
            return False
        self.in_flight += 1
        return True

    def release(self, *, taken: bool = False) -> None:
        """Give back a slot; ``taken``: its call has no outcome for the consumer to take."""
        if self.in_flight <= 0:
            raise RuntimeError("a slot was given back more often than taken")
        self.in_flight -= 1
        if not taken:
            self._unconsumed += 1
        if self._waiters:
            self._wake()

    def taken(self) -> None:
        """Record an outcome the consumer took: room for one more call in the window."""
        self._unconsumed -= 1
        if self._waiters:
            self._wake()

    def _free(self) -> int:
        free = self.limit - self.in_flight
        room = self.window - self.in_flight - self._unconsumed
        return free if free < room else room  # not min(): this runs per call, min() costs more


# --------------------------------------------------------------------------------------------
# RetryBudget


class RetryBudget:
    """A token bucket that bounds retries, like the AWS SDKs' "standard" retry mode.

    It starts full with ``capacity`` tokens. Each retry takes ``retry_cost`` tokens
    (``timeout_retry_cost`` after a timeout); when too few are left the retry is refused, so a
    failing service sees the retry rate drop to a trickle instead of multiplying its load. Each
    success puts ``success_refund`` back, up to ``capacity``. With the defaults, 100 retries in a
    row empty the bucket and 5 successes earn one retry back. Use it from one event loop only.

    Args:
        capacity: The most tokens the bucket holds, and the number it starts with.
        retry_cost: The tokens a retry takes.
        timeout_retry_cost: The tokens a retry after a timeout takes.
        success_refund: The tokens a success puts back.

    Raises:
        ConfigurationError: A value that is not a non-negative integer.
    """

    def __init__(
        self,
        capacity: int = 500,
        *,
        retry_cost: int = 5,
        timeout_retry_cost: int = 10,
        success_refund: int = 1,
    ) -> None:
        check_number("capacity", capacity, minimum=0, error=ConfigurationError)
        check_number("retry_cost", retry_cost, minimum=0, error=ConfigurationError)
        check_number("timeout_retry_cost", timeout_retry_cost, minimum=0, error=ConfigurationError)
        check_number("success_refund", success_refund, minimum=0, error=ConfigurationError)
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
        """Take the cost of one retry and return True, or return False and take nothing.

        Args:
            after_timeout: The retry follows a timeout: it costs ``timeout_retry_cost``.

        Returns:
            Whether the retry may be made.
        """
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


#: The clock of ``RateLimit``: anyio's, as every deadline's (a test may hold it).
_clock = anyio.current_time


class RateLimit:
    """A client-side limit of requests per second: a token bucket each request on the wire takes
    one from.

    The bucket holds at most ``burst`` tokens (it starts full) and gains ``per_second`` tokens a
    second. Every request a client sends takes one as it goes out, with its connection of the pool
    in hand: each attempt of a call (a retry too), each redirect followed, in direct calls, walks
    and bulk calls alike. So in any window of ``t`` seconds the client sends at most
    ``per_second * t + burst`` requests, however its pool frees up. When no token is left the
    request waits its turn, first come first served, holding its connection (every request of
    the pool waits for the same bucket). A wait that would end past the call's ``deadline`` is
    not begun, nor, for a direct call, one longer than ``Timeout.pool`` (``PoolTimeoutError``);
    a token taken for a request that is then not sent is given back.

    The client and every client made by ``with_options`` share it. Its state, for a progress bar
    or a metric: ``tokens`` and ``waiting``. It belongs to one event loop: the client's (a
    ``SearchClient``'s runs in a thread of its own; read ``tokens`` in ``on_progress`` or a
    middleware, which run there).

    The client uses only ``wait``, ``take``, ``give_back`` and ``release``: a subclass that
    overrides them takes its tokens elsewhere (``asyncsearch.ray.SharedRateLimit``: from one
    quota that every Ray worker of an export shares).

    Args:
        per_second: The tokens gained per second: the sustained rate of requests.
        burst: The most tokens the bucket holds: how many requests may go at once after a
            quiet time.

    Raises:
        ConfigurationError: A ``per_second`` that is not a positive finite number, or a
            ``burst`` that is not an integer of at least 1.
    """

    def __init__(self, per_second: float, *, burst: int = 1) -> None:
        self.per_second: float = check_positive("per_second", per_second, unit="")
        self.burst: int = check_number("burst", burst, minimum=1, error=ConfigurationError)
        #: How many requests wait for a token now.
        self.waiting = 0
        self._tokens = float(burst)
        self._stamp = -math.inf  # the clock's time of ``_tokens``: before any, it is full
        self._lock = asyncio.Lock()  # the queue of waiting requests: first come, first served

    def _refill(self) -> float:
        now = _clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.per_second)
        self._stamp = now
        return self._tokens

    @property
    def tokens(self) -> float:
        """The tokens in the bucket now, with a fraction."""
        return self._refill()

    def wait(self, after: float = 0.0) -> float:
        """Seconds a request would wait for its token, after every one waiting now.

        Args:
            after: When the request asks, in seconds from now.

        Returns:
            The seconds it would wait then (0.0: a token is there for it).
        """
        tokens = min(self.burst, self._refill() + after * self.per_second)
        return max(0.0, self.waiting + 1 - tokens) / self.per_second

    async def take(self) -> None:
        """Take a token, waiting for it in turn; a wait cancelled takes none."""
        if self.waiting or self._refill() < 1:
            self.waiting += 1
            try:
                async with self._lock:  # first come, first served
                    await anyio.sleep(max(0.0, 1 - self._refill()) / self.per_second)
            finally:
                self.waiting -= 1
            self._refill()
        # Taken with no await since the wait ended, so that a cancelled wait takes nothing; a
        # timer may end a hair early, leaving the bucket that hair below 0 (the next one waits).
        self._tokens -= 1

    def give_back(self, tokens: int = 1) -> None:
        """Put back the tokens of requests that were not sent (never above ``burst``).

        Args:
            tokens: How many.
        """
        self._tokens = min(self.burst, self._refill() + tokens)

    async def release(self) -> None:
        """Give back the tokens held ahead of use: the client that owns the pool calls it as it
        closes. A ``RateLimit`` holds none (this does nothing); ``asyncsearch.ray.SharedRateLimit``
        returns the unused tokens leased to this process. The limit stays usable."""

    def __repr__(self) -> str:
        return f"RateLimit(per_second={self.per_second:g}, burst={self.burst})"
