"""Tests of the generic concurrency layer: fan_out, AdaptiveConcurrency, RetryBudget.

No network: the functions are fakes that sleep on the event loop or wait on events. Timing is
asserted only as event order or as lower bounds, never as tight wall-clock ratios.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from asyncsearch._concurrency import (
    AdaptiveConcurrency,
    FanOut,
    Outcome,
    RetryBudget,
    fan_out,
    limited_fan_out,
)
from asyncsearch._errors import ConfigurationError, InvalidRequestError

from .helpers import (  # noqa: F401 - no_loop_errors is an autouse fixture
    WAYS_OUT,
    Boom,
    no_loop_errors,
    other_tasks,
    turns,
)

pytestmark = pytest.mark.timeout(30)


class Fatal(BaseException):
    """A BaseException that is not an Exception, raised on purpose."""


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


@pytest.mark.parametrize("step", [6.0, 100.0])
def test_a_large_increase_step_never_grows_the_limit_past_maximum(step: float) -> None:
    """One success after a cut may add a whole slot or more past maximum (2 + 6 / 2 = 5): the
    limit stops at maximum, and so do the slots handed out."""
    c = AdaptiveConcurrency(4, increase_step=step)
    c.on_overload()
    assert c.limit == 2
    for _ in range(50):
        c.on_success()
        assert c.limit <= 4
    assert c.limit == 4
    assert [c.take() for _ in range(5)] == [True] * 4 + [False]


async def test_pause_extends_and_never_shortens() -> None:
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


async def test_a_pause_that_begins_while_a_call_waits_in_line_holds_it_back() -> None:
    # A slot handed to the first in line while a pause is on: the call waits the pause out
    # holding it, and a call cancelled then gives it back.
    c = AdaptiveConcurrency(1)
    await c.acquire()
    waiter = asyncio.ensure_future(c.acquire())
    await turns(3)
    c.pause(3600)  # the service asked everyone to wait, after the call got in line
    c.release()
    await turns(5)
    assert not waiter.done()  # handed the slot, but the pause is on
    assert c.in_flight == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert c.in_flight == 0  # the slot it held through the pause is back


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


@pytest.mark.parametrize("value", ["abc", b"abc", bytearray(b"abc"), memoryview(b"abc")])
async def test_fan_out_refuses_a_single_string_or_bytes(value: Any) -> None:
    calls: list[object] = []

    async def record(item: object) -> None:
        calls.append(item)

    with pytest.raises(InvalidRequestError, match="not a single"):
        fan_out(record, value)
    assert calls == []


@pytest.mark.parametrize("free_slot", [True, False], ids=["free-slot", "full"])
def test_acquire_under_trio_says_asyncio_only(free_slot: bool) -> None:
    controller = AdaptiveConcurrency(1)
    if not free_slot:
        controller.in_flight = 1  # the slow path: no slot free

    async def main() -> BaseException | None:
        try:
            await controller.acquire()
        except BaseException as exc:
            return exc
        return None

    error = anyio.run(main, backend="trio")
    assert isinstance(error, ConfigurationError), repr(error)
    assert "asyncio only" in str(error)
    assert controller.in_flight == (0 if free_slot else 1)  # no slot taken
