"""Tests of the generic concurrency layer: fan_out, Pager, AdaptiveConcurrency, RetryBudget.

No network: the functions are fakes that sleep on the event loop or wait on events. Timing is
asserted only as event order or as lower bounds, never as tight wall-clock ratios.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import logging
import random
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

from asyncsearch._concurrency import (
    AdaptiveConcurrency,
    FanOut,
    Outcome,
    Pager,
    RetryBudget,
    fan_out,
    limited_fan_out,
)
from asyncsearch._errors import ConfigurationError, InvalidRequestError

pytestmark = pytest.mark.timeout(30)

WAYS_OUT = [
    "exhausted",
    "aclose",
    "async_with",
    "body_exception",
    "cancelled_in_anext",
    "cancelled_in_body",
    "anyio_timeout",
    "break",
]


class Boom(Exception):
    """An error raised on purpose by a fake function."""


class Fatal(BaseException):
    """A BaseException that is not an Exception, raised on purpose."""


@pytest.fixture(autouse=True)
async def no_loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fail the test if asyncio reports anything: a task destroyed while pending, an exception
    never retrieved, a failing finaliser. (Warnings are already errors in the pytest config.)"""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    yield reported
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(previous)
    assert reported == []


def other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# --------------------------------------------------------------------------------------------
# Outcome


def test_outcome_is_frozen_and_slotted() -> None:
    ok = Outcome("a", 1, None)
    failed: Outcome[str, int] = Outcome("b", None, Boom("x"))
    assert ok.ok
    assert not failed.ok
    assert (ok.item, ok.value, ok.error) == ("a", 1, None)
    with pytest.raises(AttributeError):  # frozen (dataclasses' FrozenInstanceError is one too)
        ok.value = 2  # type: ignore[misc]
    assert not hasattr(ok, "__dict__")
    assert ok == Outcome("a", 1, None)
    assert hash(ok) == hash(Outcome("a", 1, None))
    match failed:
        case Outcome(item, None, Boom() as error):
            assert (item, str(error)) == ("b", "x")
        case _:
            pytest.fail("Outcome lost its match pattern")


# --------------------------------------------------------------------------------------------
# fan_out: what it yields


async def test_fan_out_never_exceeds_concurrency() -> None:
    in_flight = 0
    peak = 0

    async def func(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(random.uniform(0, 0.002))
        in_flight -= 1
        return i * 2

    async with fan_out(func, range(200), concurrency=7) as outcomes:
        values = sorted([o.value async for o in outcomes if o.value is not None])
    assert values == [i * 2 for i in range(200)]
    assert peak == 7  # reached, and never passed


async def test_fan_out_ordered_yields_in_input_order_under_random_delays() -> None:
    finished: list[int] = []

    async def func(i: int) -> int:
        await asyncio.sleep(random.uniform(0, 0.005))
        finished.append(i)
        return i

    async with fan_out(func, range(100), concurrency=8, ordered=True) as outcomes:
        got = [o.item async for o in outcomes]
    assert got == list(range(100))
    assert finished != list(range(100))  # the calls really did finish out of order


async def test_fan_out_unordered_yields_as_completed() -> None:
    gates = {i: asyncio.Event() for i in range(3)}

    async def func(i: int) -> int:
        await gates[i].wait()
        return i

    async with asyncio.timeout(5), fan_out(func, range(3), concurrency=3) as outcomes:
        got = []
        for i in (2, 0, 1):
            gates[i].set()
            got.append((await anext(outcomes)).item)
        with pytest.raises(StopAsyncIteration):
            await anext(outcomes)
    assert got == [2, 0, 1]


async def test_fan_out_ordered_holds_back_a_finished_item_until_the_head_is_done() -> None:
    gates = {i: asyncio.Event() for i in range(2)}
    finished: list[int] = []
    one_finished = asyncio.Event()

    async def func(i: int) -> int:
        await gates[i].wait()
        finished.append(i)
        if i == 1:
            one_finished.set()
        return i

    async with asyncio.timeout(5), fan_out(func, range(2), ordered=True) as outcomes:
        gates[1].set()
        head = asyncio.ensure_future(anext(outcomes))
        await one_finished.wait()
        await turns()
        assert finished == [1]
        assert not head.done()
        gates[0].set()
        assert (await head).item == 0
        assert (await anext(outcomes)).item == 1


@pytest.mark.parametrize("ordered", [False, True])
async def test_fan_out_yields_every_item_once_per_occurrence_with_errors_captured(
    ordered: bool,
) -> None:
    items = [1, 2, 2, 3, 3, 3, 4, 5, 6, 6, 9, 9, 9, 9]
    calls: Counter[int] = Counter()

    async def func(i: int) -> str:
        calls[i] += 1
        await asyncio.sleep(random.uniform(0, 0.002))
        if i % 3 == 0:
            raise Boom(f"no {i}")
        return f"v{i}"

    async with fan_out(func, items, concurrency=4, ordered=ordered) as fo:
        outcomes = [o async for o in fo]

    assert Counter(o.item for o in outcomes) == Counter(items)
    assert calls == Counter(items)
    for o in outcomes:
        if o.item % 3 == 0:
            assert not o.ok
            assert isinstance(o.error, Boom)
            assert str(o.error) == f"no {o.item}"
            assert o.value is None
        else:
            assert o.ok
            assert o.value == f"v{o.item}"
    if ordered:
        assert [o.item for o in outcomes] == items


async def test_fan_out_accepts_an_async_iterable() -> None:
    async def items() -> AsyncIterator[int]:
        for i in range(20):
            await asyncio.sleep(0)
            yield i

    async def func(i: int) -> int:
        return -i

    async with fan_out(func, items(), ordered=True) as fo:
        got = [(o.item, o.value) async for o in fo]
    assert got == [(i, -i) for i in range(20)]


@pytest.mark.parametrize("source", ["list", "generator"])
async def test_fan_out_of_no_items_yields_nothing(source: str) -> None:
    async def func(i: int) -> int:
        raise AssertionError("never called")

    items: Any = [] if source == "list" else iter(())
    async with fan_out(func, items) as fo:
        assert [o async for o in fo] == []


async def test_fan_out_raises_an_error_of_the_items_after_the_outcomes_before_it() -> None:
    def items() -> Iterator[int]:
        yield from range(5)
        raise Boom("the items broke")

    async def func(i: int) -> int:
        await asyncio.sleep(0.001)
        return i

    got = []

    async def consume() -> None:
        async with fan_out(func, items(), concurrency=2) as fo:
            async for o in fo:
                got.append(o.item)

    with pytest.raises(Boom, match="the items broke"):
        await consume()
    assert sorted(got) == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------------------------
# fan_out: cancellation and other BaseExceptions propagate


async def test_fan_out_cancelled_error_from_func_propagates_and_is_no_outcome() -> None:
    before = other_tasks()
    calls: list[int] = []
    seen: list[Outcome[int, int]] = []

    async def func(i: int) -> int:
        calls.append(i)
        if i == 3:
            raise asyncio.CancelledError
        await asyncio.sleep(0.05 if i > 3 else 0)
        return i

    async def consume() -> None:
        async for o in fan_out(func, range(200), concurrency=4):
            seen.append(o)

    with pytest.raises(asyncio.CancelledError):
        await consume()
    assert all(o.item != 3 for o in seen)
    assert other_tasks() == before
    n = len(calls)
    await asyncio.sleep(0.1)
    assert len(calls) == n  # nothing started after the fan-out stopped


async def test_fan_out_base_exception_from_func_propagates() -> None:
    before = other_tasks()

    async def func(i: int) -> int:
        if i == 2:
            raise Fatal
        await asyncio.sleep(0.01)
        return i

    async def consume() -> None:
        async with fan_out(func, range(10), concurrency=3) as fo:
            async for _ in fo:
                pass

    with pytest.raises(Fatal):
        await consume()
    assert other_tasks() == before


class Gone(Exception):
    pass


@pytest.mark.parametrize("gathered", [False, True])
async def test_fan_out_stop_on_ends_the_whole_fan_out(gathered: bool) -> None:
    before = other_tasks()
    release = asyncio.Event()
    started: list[int] = []
    cancelled: list[int] = []

    async def func(i: int) -> int:
        started.append(i)
        if i == 5:
            raise Gone(i)
        if i == 6:
            raise ValueError(i)  # not in stop_on: an outcome like any other
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    def endless() -> Iterator[int]:
        yield from itertools.count()

    async def consume() -> None:
        fo = fan_out(func, endless(), concurrency=8, stop_on=Gone)
        if gathered:
            await fo._gather()
            return
        async with fo:
            async for _ in fo:
                raise AssertionError("nothing finishes before Gone")

    with pytest.raises(Gone):
        await consume()
    assert max(started) < 16  # no more items were read than workers had started
    assert sorted(cancelled) == sorted(set(started) - {5, 6})  # the calls in flight: cancelled
    assert other_tasks() == before
    with pytest.raises(InvalidRequestError, match="stop_on"):
        fan_out(func, range(3), stop_on=KeyboardInterrupt)  # type: ignore[arg-type]


async def test_cancelling_the_caller_cancels_the_calls_in_flight() -> None:
    started = asyncio.Event()
    cancelled: list[int] = []

    async def func(i: int) -> int:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    async def consume() -> None:
        async for _ in fan_out(func, range(100), concurrency=5):
            raise AssertionError("nothing finishes")

    task = asyncio.create_task(consume())
    await started.wait()
    await turns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(cancelled) == [0, 1, 2, 3, 4]  # cleaned up before the cancellation arrived


# --------------------------------------------------------------------------------------------
# fan_out: bounded memory, laziness, backpressure


async def test_fan_out_memory_and_tasks_stay_flat_over_100k_items() -> None:
    n = 100_000
    concurrency = 16

    def items() -> Iterator[int]:
        yield from range(n)

    async def func(i: int) -> int:
        if i % 50 == 0:
            await asyncio.sleep(0)
        return i

    baseline_tasks = len(asyncio.all_tasks())
    peak_tasks = 0
    count = 0
    total = 0
    tracemalloc.start()
    try:
        start_bytes, _ = tracemalloc.get_traced_memory()
        async with fan_out(func, items(), concurrency=concurrency) as fo:
            async for o in fo:
                count += 1
                total += o.value or 0
                if count % 1000 == 0:
                    peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n
    assert total == sum(range(n))
    # One task per item, or every outcome kept, would be tens of megabytes; even the list of
    # 100,000 ints alone would be over 3 MB. The pipeline itself needs a few tens of kilobytes.
    assert peak_bytes - start_bytes < 1_000_000
    assert peak_tasks <= baseline_tasks + concurrency


async def test_fan_out_reads_items_lazily_and_a_slow_consumer_holds_calls_back() -> None:
    concurrency = 4
    window = 2 * concurrency
    pulled = 0

    def items() -> Iterator[int]:
        nonlocal pulled
        for i in range(10_000):
            pulled += 1
            yield i

    async def func(i: int) -> int:
        return i

    consumed = 0
    ahead = []
    async with fan_out(func, items(), concurrency=concurrency) as fo:
        async for _ in fo:
            consumed += 1
            await turns(20)  # a slow consumer: the workers run ahead as far as allowed
            ahead.append(pulled - consumed)
            if consumed == 50:
                break
    assert max(ahead) == window  # they do run ahead, and no further
    assert pulled <= 50 + window


async def test_fan_out_ordered_bounds_the_reorder_window_behind_a_slow_head() -> None:
    concurrency = 4
    window = 4 * concurrency
    head = asyncio.Event()
    window_full = asyncio.Event()
    pulled = 0
    calls: list[int] = []

    def items() -> Iterator[int]:
        nonlocal pulled
        for i in range(1000):
            pulled += 1
            yield i

    async def func(i: int) -> int:
        calls.append(i)
        if len(calls) == window:
            window_full.set()
        if i == 0:
            await head.wait()
        return i

    async with (
        asyncio.timeout(10),
        fan_out(func, items(), concurrency=concurrency, ordered=True) as fo,
    ):
        first = asyncio.ensure_future(anext(fo))
        await window_full.wait()
        await asyncio.sleep(0.02)  # time to run further, if anything could
        assert not first.done()
        assert pulled == window  # the window filled up behind the slow head, and stopped there
        assert calls == list(range(window))
        head.set()
        assert (await first).item == 0
        rest = [o.item async for o in fo]
    assert rest == list(range(1, 1000))


# --------------------------------------------------------------------------------------------
# fan_out: every way out leaves nothing behind


@pytest.mark.parametrize("how", WAYS_OUT)
async def test_fan_out_every_way_out_leaves_nothing_running(how: str) -> None:
    before = other_tasks()
    calls: list[int] = []
    cancelled: list[int] = []
    closed: list[bool] = []
    finite = how == "exhausted"

    async def items() -> AsyncIterator[int]:
        try:
            for i in range(20) if finite else itertools.count():
                yield i
        finally:
            closed.append(True)

    async def func(i: int) -> int:
        calls.append(i)
        if finite or i == 0:
            await asyncio.sleep(0)
            return i
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    def make() -> FanOut[int, int]:
        return fan_out(func, items(), concurrency=4)

    if how == "exhausted":
        got = [o.item async for o in make()]
        assert sorted(got) == list(range(20))
    elif how == "aclose":
        fo = make()
        assert (await anext(fo)).item == 0
        await fo.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(fo)
    elif how == "async_with":
        async with make() as fo:
            async for _ in fo:
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
        await asyncio.sleep(0.01)  # the consumer now waits inside __anext__ or in its body
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
    assert closed == [True]
    if not finite:
        assert 0 in calls
        # every call that was still running got cancelled, none finished or leaked
        assert sorted(cancelled) == sorted(i for i in calls if i != 0)
        assert len(cancelled) >= 3
    n = len(calls)
    await asyncio.sleep(0.02)
    assert len(calls) == n


async def test_fan_out_cleanup_completes_inside_a_cancelled_anyio_scope() -> None:
    before = other_tasks()
    cleaned: list[int] = []

    running = 0

    async def func(i: int) -> int:
        nonlocal running
        running += 1
        if running == 3:
            scope.deadline = anyio.current_time()  # all three calls are under way: time is up
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.02)  # cleanup that awaits, like closing a connection
            cleaned.append(i)
            raise
        return i

    # anyio cancels the consumer again on every loop turn until it leaves the scope: only a
    # shielded cleanup gets to wait for the calls it cancelled.
    with anyio.move_on_after(3600) as scope:
        async for _ in fan_out(func, range(10), concurrency=3):
            pass
    assert scope.cancelled_caught
    assert sorted(cleaned) == [0, 1, 2]
    assert other_tasks() == before


async def test_fan_out_aclose_from_another_task_ends_the_iteration() -> None:
    async def func(i: int) -> int:
        await asyncio.sleep(3600)
        return i

    fo = fan_out(func, range(10))
    waiter = asyncio.ensure_future(anext(fo))
    await asyncio.sleep(0.01)
    await fo.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 5)


async def test_fan_out_refuses_two_concurrent_consumers() -> None:
    async def func(i: int) -> int:
        await asyncio.sleep(3600)
        return i

    async with fan_out(func, range(3)) as fo:
        first = asyncio.ensure_future(anext(fo))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already being iterated"):
            await anext(fo)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_fan_out_does_nothing_until_iterated() -> None:
    called = []

    async def func(i: int) -> int:
        called.append(i)
        return i

    before = other_tasks()
    fo = fan_out(func, range(3))
    await asyncio.sleep(0.01)
    assert called == []
    assert other_tasks() == before
    await fo.aclose()
    assert [o async for o in fo] == []
    assert called == []


# --------------------------------------------------------------------------------------------
# FanOut._gather: the whole fan-out at once, in input order (gather_extractions runs on it)


@pytest.mark.parametrize("sized", [True, False])
async def test_gather_returns_every_outcome_in_input_order_whatever_order_calls_end_in(
    sized: bool,
) -> None:
    # Later items are released first, so every call ends after the ones behind it.
    gates = {i: asyncio.Event() for i in range(37)}

    async def func(i: int) -> int:
        if i % 5 == 3:
            raise Boom(str(i))
        await gates[i].wait()
        return i * 10

    items = [*range(37), 7, 7]  # a duplicate is called once per occurrence
    gates[7] = asyncio.Event()
    progress: list[tuple[int, int | None]] = []
    fo = fan_out(
        func,
        items if sized else iter(items),
        concurrency=64,
        on_progress=lambda d, t: progress.append((d, t)),
    )
    task = asyncio.create_task(fo._gather())
    await turns()
    for i in sorted(gates, reverse=True):
        gates[i].set()
        await turns(1)
    outcomes = await task
    assert [o.item for o in outcomes] == items
    for o in outcomes:
        if o.item % 5 == 3:
            assert isinstance(o.error, Boom)
            assert o.value is None
        else:
            assert o.error is None
            assert o.value == o.item * 10
    assert progress == [(d, len(items) if sized else None) for d in range(1, len(items) + 1)]
    assert other_tasks() == set()


async def test_gather_grows_past_the_first_guess_for_items_of_unknown_number() -> None:
    async def func(i: int) -> int:
        await asyncio.sleep(0)
        return i

    async def ids() -> AsyncIterator[int]:
        for i in range(1000):
            yield i

    for items in (iter(range(1000)), ids()):
        outcomes = await fan_out(func, items, concurrency=9)._gather()
        assert [o.value for o in outcomes] == list(range(1000))
    assert await fan_out(func, [], concurrency=9)._gather() == []


async def test_gather_keeps_what_keep_makes_of_each_outcome_in_input_order() -> None:
    async def func(i: int) -> int:
        await asyncio.sleep(0.001 * (i % 3))
        if i == 4:
            raise Boom("four")
        return -i

    kept = await fan_out(func, iter(range(10)), concurrency=5)._gather(
        lambda o: (o.item, o.value, type(o.error).__name__)
    )
    assert kept == [(i, None, "Boom") if i == 4 else (i, -i, "NoneType") for i in range(10)]


async def test_gather_raises_an_error_of_the_items_and_calls_nothing_after_it() -> None:
    called: list[int] = []

    async def func(i: int) -> int:
        called.append(i)
        return i

    def items() -> Iterator[int]:
        yield from range(5)
        raise LookupError("the ids ran dry")

    with pytest.raises(LookupError, match="ran dry"):
        await fan_out(func, items(), concurrency=2)._gather()
    assert sorted(called) == list(range(5))
    assert other_tasks() == set()


async def test_gather_raises_an_error_of_on_progress_and_stops() -> None:
    started = 0

    async def func(i: int) -> int:
        nonlocal started
        started += 1
        await asyncio.sleep(0)
        return i

    def on_progress(done: int, total: int | None) -> None:
        if done == 5:
            raise Boom("progress bar broke")

    with pytest.raises(Boom, match="progress bar broke"):
        await fan_out(func, range(10_000), concurrency=3, on_progress=on_progress)._gather()
    await turns()
    assert started < 20
    assert other_tasks() == set()


async def test_gather_cancelled_cancels_the_calls_in_flight() -> None:
    entered = asyncio.Event()
    cancelled = 0

    async def func(i: int) -> int:
        nonlocal cancelled
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise
        return i

    task = asyncio.create_task(fan_out(func, range(100), concurrency=4)._gather())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == 4
    assert other_tasks() == set()


async def test_gather_refuses_a_fan_out_that_has_started() -> None:
    async def func(i: int) -> int:
        return i

    async with fan_out(func, range(3)) as fo:
        await fo.__anext__()
        with pytest.raises(RuntimeError, match="not started"):
            await fo._gather()


# --------------------------------------------------------------------------------------------
# fan_out: on_progress, arguments, controller


async def test_on_progress_counts_finished_calls_against_the_total() -> None:
    progress: list[tuple[int, int | None]] = []

    async def func(i: int) -> int:
        if i == 3:
            raise Boom
        return i

    async with fan_out(
        func, list(range(10)), concurrency=3, on_progress=lambda d, t: progress.append((d, t))
    ) as fo:
        outcomes = [o async for o in fo]
    assert len(outcomes) == 10
    assert progress == [(d, 10) for d in range(1, 11)]  # failures count as done too

    progress.clear()
    async with fan_out(
        func, (i for i in range(4)), on_progress=lambda d, t: progress.append((d, t))
    ) as fo:
        _ = [o async for o in fo]
    assert progress == [(1, None), (2, None), (3, None), (4, None)]


async def test_an_error_in_on_progress_stops_the_fan_out_and_is_raised() -> None:
    before = other_tasks()
    calls: list[int] = []

    async def func(i: int) -> int:
        calls.append(i)
        await asyncio.sleep(0.001)
        return i

    def on_progress(done: int, total: int | None) -> None:
        if done == 5:
            raise Boom("progress bar broke")

    async def consume() -> None:
        async with fan_out(func, range(200), concurrency=3, on_progress=on_progress) as fo:
            async for _ in fo:
                pass

    with pytest.raises(Boom, match="progress bar broke"):
        await consume()
    assert other_tasks() == before
    n = len(calls)
    assert n < 20
    await asyncio.sleep(0.02)
    assert len(calls) == n


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -3}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": "4"}, "concurrency"),
        ({"func": "not callable"}, "func"),
        ({"items": 42}, "items"),
        ({"on_progress": "nope"}, "on_progress"),
    ],
)
async def test_fan_out_validates_its_arguments_before_starting(
    kwargs: dict[str, Any], message: str
) -> None:
    called = []

    async def func(i: int) -> int:
        called.append(i)
        return i

    arguments: dict[str, Any] = {"func": func, "items": range(3), **kwargs}
    before = other_tasks()
    with pytest.raises(InvalidRequestError, match=message):
        fan_out(arguments.pop("func"), arguments.pop("items"), **arguments)
    await asyncio.sleep(0)
    assert called == []
    assert other_tasks() == before


async def test_fan_out_respects_the_controller_limit() -> None:
    controller = AdaptiveConcurrency(3)
    in_flight = 0
    peak = 0

    async def func(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return i

    async with limited_fan_out(func, range(60), controller) as fo:
        assert len([o async for o in fo]) == 60
    assert peak == 3
    assert controller.in_flight == 0  # every slot given back


async def test_fan_out_follows_the_controller_when_it_cuts_the_limit() -> None:
    controller = AdaptiveConcurrency(8)
    in_flight = 0
    peak_after_cut = 0
    cut = False

    async def func(i: int) -> int:
        nonlocal in_flight, peak_after_cut, cut
        in_flight += 1
        if cut:
            peak_after_cut = max(peak_after_cut, in_flight)
        await asyncio.sleep(0.002)
        if i == 10:
            controller.on_overload()  # 8 -> 4
            cut = True
        in_flight -= 1
        return i

    async with limited_fan_out(func, range(200), controller) as fo:
        assert len([o async for o in fo]) == 200
    assert controller.limit == 4
    # calls already running finish; a new one starts only while fewer than 4 are running
    assert peak_after_cut == 4
    assert in_flight == 0


async def test_fan_out_waits_while_the_controller_is_paused() -> None:
    controller = AdaptiveConcurrency(4)
    started: list[float] = []

    async def func(i: int) -> int:
        started.append(time.monotonic())
        return i

    paused_at = time.monotonic()
    controller.pause(0.2)
    async with limited_fan_out(func, range(5), controller) as fo:
        first = asyncio.ensure_future(anext(fo))
        await turns(20)
        assert started == []  # paused: nothing may start
        assert (await first).ok
        assert len([o async for o in fo]) == 4
    assert min(started) >= paused_at + 0.2


async def test_an_item_is_pulled_only_once_its_call_may_start() -> None:
    # One gate per call: a worker held back by the in-flight limit has taken no item yet (a
    # second gate after the pull would hold items that cannot be sent).
    limiter = AdaptiveConcurrency(4)
    limiter.on_overload()  # 4 -> 2
    release = asyncio.Event()
    pulled = 0

    def items() -> Iterator[int]:
        nonlocal pulled
        for i in range(100):
            pulled += 1
            yield i

    async def func(i: int) -> int:
        await release.wait()
        return i

    async with limited_fan_out(func, items(), limiter) as fo:
        first = asyncio.ensure_future(anext(fo))
        await turns(20)
        assert limiter.in_flight == 2
        assert pulled == 2
        release.set()
        assert (await first).ok
        assert len([o async for o in fo]) == 99
    assert limiter.in_flight == 0


@pytest.mark.parametrize("way_out", ["exhausted", "aclose"])
async def test_a_slot_of_the_gate_holds_a_connection_of_the_pool(way_out: str) -> None:
    # The pool is part of the one gate: never more calls than free connections, and every
    # connection back in the pool however the fan-out ends (also from a call waiting for one).
    pool = asyncio.Semaphore(2)
    limiter = AdaptiveConcurrency(4, pool=pool)
    release = asyncio.Event()
    running = 0
    peak = 0

    async def func(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return i

    async with limited_fan_out(func, range(10), limiter) as fo:
        first = asyncio.ensure_future(anext(fo))
        await turns(20)
        assert running == 2
        assert limiter.in_flight == 4  # two calls running, two waiting for a connection
        if way_out == "aclose":
            await fo.aclose()
            with pytest.raises(StopAsyncIteration):
                await first
        else:
            release.set()
            assert (await first).ok
            assert len([o async for o in fo]) == 9
    assert peak == 2
    assert limiter.in_flight == 0
    for _ in range(2):  # both connections are free again: taken without waiting
        async with asyncio.timeout(1):
            await pool.acquire()


# --------------------------------------------------------------------------------------------
# AdaptiveConcurrency


def test_adaptive_concurrency_starts_at_maximum_and_halves_on_overload() -> None:
    c = AdaptiveConcurrency(64)
    assert c.limit == 64
    c.on_overload()
    assert c.limit == 32


async def test_a_burst_of_overloads_from_one_window_cuts_the_limit_once() -> None:
    c = AdaptiveConcurrency(64)
    for _ in range(64):
        await c.acquire()
    for _ in range(64):  # 64 calls in flight all get a 429
        c.on_overload()
        c.release()
    assert c.limit == 32
    c.on_overload()  # a call sent after the cut: a new window
    assert c.limit == 16


def test_without_slots_the_window_is_the_old_limit() -> None:
    c = AdaptiveConcurrency(64)
    for _ in range(64):
        c.on_overload()
    assert c.limit == 32
    c.on_overload()
    assert c.limit == 16


def test_successes_also_close_the_window_after_a_cut() -> None:
    c = AdaptiveConcurrency(16)
    c.on_overload()  # window of 16 replies
    assert c.limit == 8
    for _ in range(14):
        c.on_success()
    grown = c.limit
    assert grown == 9
    c.on_overload()  # the 16th reply of the old window: ignored
    assert c.limit == grown
    c.on_overload()
    assert c.limit == 4


def test_the_limit_never_goes_below_minimum() -> None:
    c = AdaptiveConcurrency(10, minimum=3)
    for _ in range(100):
        c.on_overload()
        for _ in range(10):
            c.on_success()  # close each window so every overload counts
        c.on_overload()
    assert c.limit == 3


def test_successes_grow_the_limit_additively_up_to_maximum() -> None:
    c = AdaptiveConcurrency(8)
    c.on_overload()
    assert c.limit == 4
    successes = 0
    while c.limit == 4:
        c.on_success()
        successes += 1
    assert c.limit == 5
    assert 4 <= successes <= 5  # about one step per limit's worth of successes
    for _ in range(1000):
        c.on_success()
    assert c.limit == 8


def test_increase_step_and_decrease_factor_are_used() -> None:
    c = AdaptiveConcurrency(100, decrease_factor=0.25, increase_step=4.0)
    c.on_overload()
    assert c.limit == 25
    for _ in range(25):
        c.on_success()  # closes the window, grows by about 4
    assert 27 <= c.limit <= 29


def test_pause_extends_and_never_shortens() -> None:
    c = AdaptiveConcurrency(4)
    assert c.paused_for == 0.0
    c.pause(10)
    c.pause(0.1)
    assert c.paused_for > 9
    c.pause(20)
    assert c.paused_for > 19
    c.pause(0)
    c.pause(-5)
    assert c.paused_for > 19


async def test_acquire_waits_for_the_pause() -> None:
    c = AdaptiveConcurrency(4)
    paused_at = time.monotonic()
    c.pause(0.1)
    async with asyncio.timeout(5):
        await c.acquire()
    assert time.monotonic() >= paused_at + 0.1
    assert c.in_flight == 1
    c.release()
    assert c.in_flight == 0


async def test_acquire_waits_for_a_free_slot_and_a_cancelled_waiter_loses_nothing() -> None:
    c = AdaptiveConcurrency(1)
    await c.acquire()
    waiter = asyncio.ensure_future(c.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    c.release()
    assert c.in_flight == 0
    async with asyncio.timeout(5):
        await c.acquire()
    assert c.in_flight == 1

    # a waiter woken by release() but cancelled before it ran passes the slot on
    first = asyncio.ensure_future(c.acquire())
    second = asyncio.ensure_future(c.acquire())
    await asyncio.sleep(0.01)
    c.release()
    first.cancel()
    async with asyncio.timeout(5):
        await second
    assert first.cancelled()
    assert c.in_flight == 1


async def test_a_higher_limit_wakes_waiters() -> None:
    c = AdaptiveConcurrency(2, increase_step=0.25)
    c.on_overload()
    c.on_success()  # the window of 2 replies is over
    assert c.limit == 1
    await c.acquire()
    waiter = asyncio.ensure_future(c.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    while c.limit < 2:
        c.on_success()
    async with asyncio.timeout(5):
        await waiter
    assert c.in_flight == 2


def test_release_without_acquire_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        AdaptiveConcurrency(2).release()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"maximum": 0},
        {"maximum": 2.0},
        {"maximum": True},
        {"maximum": 4, "minimum": 0},
        {"maximum": 4, "minimum": 5},
    ],
)
def test_adaptive_concurrency_validates_its_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        AdaptiveConcurrency(**kwargs)


# --------------------------------------------------------------------------------------------
# RetryBudget


def test_retry_budget_arithmetic() -> None:
    budget = RetryBudget()
    assert (budget.capacity, budget.tokens) == (500, 500)
    assert all(budget.try_acquire() for _ in range(100))
    assert budget.tokens == 0
    assert not budget.try_acquire()
    assert budget.tokens == 0
    for _ in range(5):
        budget.on_success()
    assert budget.tokens == 5
    assert not budget.try_acquire(after_timeout=True)  # a timeout costs 10: refused, nothing taken
    assert budget.tokens == 5
    assert budget.try_acquire()
    assert budget.tokens == 0
    for _ in range(10):
        budget.on_success()
    assert budget.try_acquire(after_timeout=True)
    assert budget.tokens == 0


def test_retry_budget_refunds_are_capped_at_capacity() -> None:
    budget = RetryBudget(20, retry_cost=3, timeout_retry_cost=7, success_refund=2)
    budget.on_success()
    assert budget.tokens == 20
    assert budget.try_acquire(after_timeout=True)
    assert budget.try_acquire()
    assert budget.tokens == 10
    for _ in range(100):
        budget.on_success()
    assert budget.tokens == 20


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity": -1},
        {"capacity": 1.5},
        {"retry_cost": -5},
        {"timeout_retry_cost": None},
        {"success_refund": True},
    ],
)
def test_retry_budget_validates_its_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RetryBudget(**kwargs)


# --------------------------------------------------------------------------------------------
# Pager


@dataclasses.dataclass(frozen=True)
class FakePage:
    number: int
    items: tuple[str, ...]
    more: bool
    total: int | None = None


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


def make_pager(fetch: Callable[[int], Awaitable[FakePage]], **kwargs: Any) -> Pager[Any]:
    options: dict[str, Any] = {
        "mode": "pages",
        "start_page": 1,
        "page_items": lambda p: p.items,
        "item_key": lambda item: item,
        "has_more": lambda p: p.more,
        "page_total": lambda p: p.total,
        "replace_items": lambda p, items: dataclasses.replace(p, items=tuple(items)),
        "logger": logging.getLogger("tests.pager"),
    }
    options.update(kwargs)
    return Pager(fetch, **options)


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
    caplog.set_level(logging.DEBUG, logger="tests.pager")
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
    caplog.set_level(logging.DEBUG, logger="tests.pager")
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
    totals = {1: 40, 2: 42, 3: None}
    service = FakeService(lambda n: FakePage(n, (f"p{n}",), more=n < 3, total=totals[n]))
    pager = make_pager(service.fetch)
    seen = [pager.total]
    async with pager:
        async for _ in pager:
            seen.append(pager.total)
    assert seen == [None, 40, 42, 42]  # a page without a total keeps the last one seen


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

    def make() -> Pager[Any]:
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
        ({"mode": "rows"}, "mode"),
        ({"start_page": "1"}, "start_page"),
        ({"start_page": None}, "start_page"),
        ({"max_pages": 0}, "max_pages"),
        ({"max_items": -1}, "max_items"),
        ({"max_items": 2.0}, "max_items"),
        ({"page_items": None}, "page_items"),
        ({"item_key": 3}, "item_key"),
        ({"has_more": "yes"}, "has_more"),
        ({"page_total": 1}, "page_total"),
        ({"replace_items": None, "dedupe": True}, "replace_items"),
        ({"replace_items": None, "max_items": 3}, "replace_items"),
    ],
)
async def test_pager_validates_its_arguments(kwargs: dict[str, Any], message: str) -> None:
    service = FakeService(endless(2))
    with pytest.raises(InvalidRequestError, match=message):
        make_pager(service.fetch, **kwargs)
    with pytest.raises(InvalidRequestError, match="fetch_page"):
        make_pager("not callable")  # type: ignore[arg-type]
    assert service.calls == []


async def test_replace_items_is_not_needed_in_items_mode() -> None:
    service = FakeService(catalogue(4, 2))
    async with make_pager(
        service.fetch, mode="items", replace_items=None, dedupe=True, max_items=3
    ) as pager:
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


@pytest.mark.parametrize("value", ["abc", b"abc", bytearray(b"abc"), memoryview(b"abc")])
async def test_fan_out_refuses_a_single_string_or_bytes(value: Any) -> None:
    calls: list[object] = []

    async def record(item: object) -> None:
        calls.append(item)

    with pytest.raises(InvalidRequestError, match="not a single"):
        fan_out(record, value)
    assert calls == []


@dataclasses.dataclass(frozen=True)
class Received:
    """A page as received: its keys and flags readable, its items not built yet."""

    page: FakePage

    @property
    def items(self) -> tuple[str, ...]:
        return self.page.items

    @property
    def more(self) -> bool:
        return self.page.more

    @property
    def total(self) -> int | None:
        return self.page.total


@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_decode_page_runs_after_the_next_request_was_sent(mode: str) -> None:
    events: list[tuple[str, int]] = []
    pages = catalogue(25, 10)

    async def fetch(n: int) -> Received:
        events.append(("sent", n))
        return Received(pages(n))

    def decode(received: Received) -> FakePage:
        events.append(("decoded", received.page.number))
        return dataclasses.replace(
            received.page, items=tuple(i.upper() for i in received.page.items)
        )

    pager = make_pager(fetch, mode=mode, decode_page=decode, dedupe=True)
    got = [x async for x in pager]
    flat = got if mode == "items" else [i for p in got for i in p.items]
    assert flat == [f"I{k}" for k in range(25)]  # the decoded items are handed out
    assert events == [
        ("sent", 1),
        ("sent", 2),
        ("decoded", 1),
        ("sent", 3),
        ("decoded", 2),
        ("decoded", 3),
    ]


async def test_decode_page_with_dedupe_and_max_items_hands_out_the_decoded_survivors() -> None:
    def page(n: int) -> FakePage:  # each page repeats the last item of the one before
        start = max((n - 1) * 10 - 1, 0)
        return FakePage(n, tuple(f"i{k}" for k in range(start, start + 10)), more=True)

    async def fetch(n: int) -> Received:
        return Received(page(n))

    def decode(received: Received) -> FakePage:
        return dataclasses.replace(
            received.page, items=tuple(i.upper() for i in received.page.items)
        )

    pages = [p async for p in make_pager(fetch, decode_page=decode, dedupe=True, max_items=15)]
    assert [p.items for p in pages] == [
        tuple(f"I{k}" for k in range(10)),
        tuple(f"I{k}" for k in range(10, 15)),
    ]


async def test_an_error_from_decode_page_ends_the_walk_and_cancels_the_next_request() -> None:
    before = other_tasks()
    cancelled: list[int] = []

    async def fetch(n: int) -> Received:
        if n > 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(n)
                raise
        return Received(FakePage(n, (f"p{n}",), more=True))

    def decode(received: Received) -> FakePage:
        raise Boom

    pager = make_pager(fetch, decode_page=decode)
    with pytest.raises(Boom):
        await anext(pager)
    assert cancelled == [2]
    assert pager.next_page == 1
    assert other_tasks() == before
    with pytest.raises(StopAsyncIteration):
        await anext(pager)


async def test_decode_page_must_keep_the_items_of_the_received_page() -> None:
    async def fetch(n: int) -> Received:
        return Received(FakePage(n, ("a", "b"), more=False))

    def decode(received: Received) -> FakePage:
        return dataclasses.replace(received.page, items=("a",))

    with pytest.raises(RuntimeError, match="1 items, the received page had 2"):
        await anext(make_pager(fetch, decode_page=decode, prefetch=False))


# -- peek: the next request goes out the moment a page is received ------------------------------


class Watched:
    """A page as received, recording when the walk reads its view (items, flags, total)."""

    def __init__(self, page: FakePage, events: list[tuple[str, int]]) -> None:
        self.page = page
        self._events = events

    def _viewed(self) -> FakePage:
        self._events.append(("viewed", self.page.number))
        return self.page

    @property
    def items(self) -> tuple[str, ...]:
        return self._viewed().items

    @property
    def more(self) -> bool:
        return self._viewed().more

    @property
    def total(self) -> int | None:
        return self._viewed().total


def watched_walk(
    page: Callable[[int], FakePage],
    *,
    hint: Callable[[FakePage], bool | None] = lambda p: p.more and bool(p.items),
    **kwargs: Any,
) -> tuple[Pager[Any], list[tuple[str, int]]]:
    """A pipelined walk with ``peek``, and the log of what it did, in order."""
    events: list[tuple[str, int]] = []

    async def fetch(n: int) -> Watched:
        events.append(("sent", n))
        return Watched(page(n), events)

    def peek(received: Watched) -> bool | None:
        events.append(("peeked", received.page.number))
        return hint(received.page)

    def decode(received: Watched) -> FakePage:
        events.append(("decoded", received.page.number))
        return received.page

    options: dict[str, Any] = {"decode_page": decode, "peek": peek, "page_size": 10}
    options.update(kwargs)
    return make_pager(fetch, **options), events


@pytest.mark.parametrize("mode", ["pages", "items"])
async def test_peek_sends_the_next_request_before_anything_of_the_page_is_read(mode: str) -> None:
    pager, events = watched_walk(catalogue(25, 10), mode=mode)
    got = [x async for x in pager]
    flat = got if mode == "items" else [i for p in got for i in p.items]
    assert flat == [f"i{k}" for k in range(25)]
    # No view is read: the request for page n + 1 follows the peek at page n at once.
    assert events == [
        ("sent", 1),
        ("peeked", 1),
        ("sent", 2),
        ("decoded", 1),
        ("peeked", 2),
        ("sent", 3),
        ("decoded", 2),
        ("peeked", 3),  # says the walk ends here: decoded at once
        ("decoded", 3),
    ]


async def test_when_peek_cannot_tell_the_walk_decides_on_the_view_first() -> None:
    pager, events = watched_walk(catalogue(15, 10), hint=lambda p: None)
    assert [i for p in [p async for p in pager] for i in p.items] == [f"i{k}" for k in range(15)]
    first = events[: events.index(("decoded", 1)) + 1]
    assert first[:2] == [("sent", 1), ("peeked", 1)]
    assert ("viewed", 1) in first
    assert first.index(("viewed", 1)) < first.index(("sent", 2)) < first.index(("decoded", 1))


def duplicates_only(n: int) -> FakePage:
    """Page 1 has i0..i9; every later page the same items in another order (never repeated)."""
    items = [f"i{k}" for k in range(10)]
    shift = n - 1
    return FakePage(n, tuple(items[shift:] + items[:shift]), more=True)


@pytest.mark.parametrize(
    ("page", "kwargs", "calls"),
    [
        (catalogue(100, 10), {"max_pages": 2}, [1, 2]),
        (catalogue(100, 10), {"max_items": 25}, [1, 2, 3]),
        (catalogue(100, 10), {"max_items": 20}, [1, 2]),
        (duplicates_only, {"dedupe": True}, [1, 2, 3, 4]),
    ],
    ids=["max_pages", "max_items", "max_items-at-a-page-end", "last-stale-page"],
)
async def test_peek_never_sends_ahead_past_what_the_page_itself_may_end(
    page: Callable[[int], FakePage], kwargs: dict[str, Any], calls: list[int]
) -> None:
    # Every page says "more" at a peek; the request for a page past a cap, or past the last
    # stale page dedupe allows, is still never sent.
    pager, events = watched_walk(page, **kwargs)
    async for _ in pager:
        pass
    assert [n for what, n in events if what == "sent"] == calls


async def test_without_page_size_peek_does_not_send_ahead_in_a_walk_with_max_items() -> None:
    pager, events = watched_walk(catalogue(100, 10), max_items=95, page_size=None)
    assert len([i async for p in pager for i in p.items]) == 95
    # Each next request waits for the page's view: how many items a page brings is not known.
    assert events.index(("viewed", 1)) < events.index(("sent", 2))


def misleading(
    reason: str,
) -> tuple[Callable[[int], FakePage], dict[str, Any], list[str], int]:
    """A service whose page the peek reads as "more" but whose decoded page ends the walk.

    Returns the pages, the pager's options, the items the walk must hand out, and the page
    sent ahead on the peek's word that must be cancelled.
    """
    if reason == "has_more":  # the page says more in its first bytes and no more in full
        return (lambda n: FakePage(n, ("a", "b"), more=False)), {}, ["a", "b"], 2
    if reason == "repeated":  # the service ignores the page number
        return (lambda n: FakePage(n, ("a", "b"), more=True)), {}, ["a", "b"], 3
    # a page larger than the page size asked for reaches max_items
    big = tuple(f"i{k}" for k in range(30))
    return (lambda n: FakePage(n, big, more=True)), {"max_items": 25}, list(big[:25]), 2


@pytest.mark.parametrize("reason", ["has_more", "repeated", "oversized-page"])
async def test_a_request_sent_on_peeks_word_is_cancelled_when_the_page_ends_the_walk(
    reason: str,
) -> None:
    page, kwargs, expected, ahead = misleading(reason)
    before = other_tasks()
    started: list[int] = []
    cancelled: list[int] = []

    async def fetch(n: int) -> Received:
        started.append(n)
        if n == ahead:
            try:
                await asyncio.sleep(3600)  # held until cancelled: it must never become a page
            except asyncio.CancelledError:
                cancelled.append(n)
                raise
        return Received(page(n))

    pager = make_pager(
        fetch,
        mode="items",
        decode_page=lambda received: received.page,
        peek=lambda received: True,
        page_size=10,
        **kwargs,
    )
    got: list[str] = []
    cancelled_by_then: list[list[int]] = []
    async for item in pager:
        got.append(item)
        cancelled_by_then.append(list(cancelled))
    assert got == expected
    assert started == list(range(1, ahead + 1))
    assert cancelled == [ahead]
    if reason != "repeated":
        # Cancelled as soon as the page is decoded, not left running while the caller holds
        # the page. (The repeated page is never handed out: the walk ends there.)
        assert cancelled_by_then == [[ahead]] * len(expected)
    assert other_tasks() == before
    assert pager.next_page == (1 if reason == "oversized-page" else None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peek": lambda page: True}, "decode_page"),
        ({"peek": 3, "decode_page": lambda page: page}, "peek"),
        ({"page_size": 0}, "page_size"),
        ({"page_size": "10"}, "page_size"),
    ],
)
async def test_pager_validates_peek_and_page_size(kwargs: dict[str, Any], message: str) -> None:
    service = FakeService(endless(2))
    with pytest.raises(InvalidRequestError, match=message):
        make_pager(service.fetch, **kwargs)
    assert service.calls == []


@pytest.mark.parametrize("free_slot", [True, False], ids=["free-slot", "full"])
def test_acquire_under_trio_says_asyncio_only(free_slot: bool) -> None:
    controller = AdaptiveConcurrency(1)
    if not free_slot:
        controller._in_flight = 1  # the slow path: no slot free

    async def main() -> BaseException | None:
        try:
            await controller.acquire()
        except BaseException as exc:
            return exc
        return None

    error = anyio.run(main, backend="trio")
    assert isinstance(error, ConfigurationError), repr(error)
    assert "asyncio only" in str(error)
    assert controller._in_flight == (0 if free_slot else 1)  # no slot taken
