"""The SDK names every task it starts, and the leak checks find its tasks by that name alone."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import asyncsearch
from asyncsearch._concurrency import (
    FAN_OUT_WORKER_TASK,
    PAGER_FETCH_TASK,
    PAGER_PREFETCH_TASK,
    fan_out,
)

from .helpers import SDK_TASK_PREFIX, client_tasks
from .test_paging import FakePage, make_pager

PACKAGE = Path(asyncsearch.__file__).resolve().parent


def _foreign_coroutine_in(folder: str) -> Any:
    """An async function whose code object says it lives in ``folder`` (like a checkout's)."""
    source = "async def held(event):\n    await event.wait()\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{folder}/asyncsearch/tests/test_servers.py", "exec"), namespace)
    return namespace["held"]


async def test_a_task_whose_code_sits_under_an_asyncsearch_folder_is_not_the_sdks() -> None:
    # The old check counted any task whose code file path contained "/asyncsearch/": in a
    # `git clone` (folder `asyncsearch`) that was every test server and the venv's aiohttp.
    held = _foreign_coroutine_in("/home/someone/src")
    release = asyncio.Event()
    task = asyncio.create_task(held(release), name="a-test-server")
    await asyncio.sleep(0)
    try:
        assert "/asyncsearch/" in task.get_coro().cr_code.co_filename  # type: ignore[union-attr]
        assert task not in client_tasks()
    finally:
        release.set()
        await task


async def test_fan_out_workers_are_found_by_their_name() -> None:
    release = asyncio.Event()

    async def call(item: int) -> int:
        await release.wait()
        return item

    async with fan_out(call, range(3), concurrency=3) as outcomes:
        first = asyncio.create_task(outcomes.__anext__())  # the workers start on the first pull
        for _ in range(3):
            await asyncio.sleep(0)
        found = client_tasks()
        assert len(found) == 3
        assert {task.get_name() for task in found} == {FAN_OUT_WORKER_TASK}
        release.set()
        results = [(await first).value] + [o.value async for o in outcomes]
        assert sorted(results) == [0, 1, 2]
    assert client_tasks() == []


async def test_pager_fetches_and_prefetches_are_found_by_their_name() -> None:
    gates = {1: asyncio.Event(), 2: asyncio.Event()}

    async def fetch(n: int) -> FakePage:
        await gates[n].wait()
        return FakePage(n, ("a",) if n < 2 else (), more=n < 2)

    pager = make_pager(fetch, prefetch=True)
    walk = pager.__aiter__()
    first = asyncio.create_task(walk.__anext__())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [task.get_name() for task in client_tasks()] == [PAGER_FETCH_TASK]
    gates[1].set()
    assert (await first).items == ("a",)
    assert [task.get_name() for task in client_tasks()] == [PAGER_PREFETCH_TASK]
    await pager.aclose()
    assert client_tasks() == []


def test_every_task_the_package_starts_is_named() -> None:
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            keywords = node.keywords
            if name == "run_coroutine_threadsafe":
                # It takes no name: the coroutine it is given must name its task itself, as
                # asyncsearch.ray's `_named(coroutine, name=...)` does.
                given = node.args[0] if node.args else None
                keywords = given.keywords if isinstance(given, ast.Call) else []
            elif name not in {"create_task", "ensure_future", "start_soon"}:
                continue
            named = [k for k in keywords if k.arg == "name"]
            if not named:
                unnamed.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
                continue
            value = named[0].value
            if isinstance(value, ast.Constant):
                assert str(value.value).startswith(SDK_TASK_PREFIX), f"{path}:{node.lineno}"
    assert unnamed == [], f"tasks started without a name: {unnamed}"
    for name in (FAN_OUT_WORKER_TASK, PAGER_FETCH_TASK, PAGER_PREFETCH_TASK):
        assert name.startswith(SDK_TASK_PREFIX)
