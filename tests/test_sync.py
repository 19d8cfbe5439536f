"""``SearchClient``, the blocking facade: against the emulator, served from a thread of its own.

The tests are plain functions: a blocking call made from a test's event loop would block the
server it waits for. Whatever the client leaves on its loop is looked for there, by task name.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import pytest

import asyncsearch
from asyncsearch import (
    APIResponse,
    AsyncSearchClient,
    ClientClosedError,
    ConfigurationError,
    EventLoopMismatchError,
    ExtractionJob,
    ExtractionResults,
    InvalidRequestError,
    NotFoundError,
    RawResponseClient,
    SearchClient,
    SearchPage,
    SearchPager,
    SyncExtractionResults,
    SyncRawResponseClient,
    SyncSearchPager,
)
from asyncsearch.testing import ServiceEmulator

from .conftest import API_KEY
from .helpers import SDK_TASK_PREFIX, TIME_SCALE

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")
#: Bound on one wait of a test for the other side (scaled like every liveness bound).
BOUND = 10.0 * TIME_SCALE
LOOP_THREAD = "asyncsearch.SearchClient.loop"
#: The task that keeps the client's loop running until close().
MAIN_TASK = "asyncsearch.SearchClient.main"


class EmulatorThread:
    """A ``ServiceEmulator`` on an event loop in a thread of its own, driven from the test's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test.emulator")
        self.emu = ServiceEmulator(api_key=API_KEY, seed=3, n_resources=30, n_jobs=20)
        self.ids = [job["id"] for job in self.emu.jobs()]

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the emulator's loop and wait for it, bounded."""
        bounded = asyncio.wait_for(coro, BOUND)
        return asyncio.run_coroutine_threadsafe(bounded, self.loop).result(BOUND + 5)

    def call(self, function: Callable[[], T]) -> T:
        """Call ``function`` on the emulator's loop (its faults live there)."""

        async def called() -> T:
            return function()

        return self.run(called())

    def client(self, **options: Any) -> SearchClient:
        return SearchClient(API_KEY, base_url=self.emu.base_url, **options)


@pytest.fixture
def served() -> Iterator[EmulatorThread]:
    server = EmulatorThread()
    server.thread.start()
    server.run(server.emu.start())
    try:
        yield server
    finally:
        server.call(server.emu.faults.release)
        server.run(server.emu.stop())
        server.loop.call_soon_threadsafe(server.loop.stop)
        server.thread.join(BOUND)
        server.loop.close()


def sdk_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(SDK_TASK_PREFIX)]


def left_on_loop(client: SearchClient, *, settle: bool = True) -> list[str]:
    """The SDK's tasks still running on the client's loop (with ``settle``, once those ending
    have ended: a held one makes it wait its whole bound)."""

    async def left() -> list[str]:
        current = asyncio.current_task()
        tasks = [
            task
            for task in asyncio.all_tasks()
            if task is not current
            and task.get_name().startswith(SDK_TASK_PREFIX)
            and task.get_name() != MAIN_TASK
        ]
        if tasks and settle:  # cancelled ones get the turns they need to end; held ones do not
            await asyncio.wait(tasks, timeout=1.0 * TIME_SCALE)
        return sorted(task.get_name() for task in tasks if not task.done())

    return client._runner.run(left())


# -- the twins -------------------------------------------------------------------------------

TWINS = [
    (AsyncSearchClient, SearchClient),
    (RawResponseClient, SyncRawResponseClient),
    (SearchPager, SyncSearchPager),
    (ExtractionResults, SyncExtractionResults),
]
#: The async names whose blocking twin has another name.
RENAMED = {
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """What a caller passes: names, kinds and defaults (not annotations: the twin's differ)."""
    parameters = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters]


@pytest.mark.parametrize(("async_type", "sync_type"), TWINS, ids=lambda t: t.__name__)
def test_every_public_method_has_a_blocking_twin_with_the_same_parameters(
    async_type: type, sync_type: type
) -> None:
    names = [
        name
        for name in dir(async_type)
        if (not name.startswith("_") or name in RENAMED) and not name.startswith("__class")
    ]
    assert names
    for name in names:
        twin = RENAMED.get(name, name)
        assert hasattr(sync_type, twin), f"{sync_type.__name__} has no {twin} (for {name})"
        mine, theirs = getattr(async_type, name), getattr(sync_type, twin)
        if isinstance(mine, property):
            assert isinstance(theirs, property), twin
        elif name != "__aexit__":  # (exc_type, exc, tb) against *exc_info
            # A twin made from the async method (_sync._Blocking) is called through .call.
            assert _parameters(getattr(theirs, "call", theirs)) == _parameters(mine), twin
    if async_type is AsyncSearchClient:
        # The constructor too (session= is refused at run time, see below).
        assert _parameters(SearchClient.__init__) == _parameters(AsyncSearchClient.__init__)


def test_session_is_refused_with_a_configuration_error() -> None:
    async def make() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ConfigurationError, match="session"):
                SearchClient(API_KEY, base_url="http://127.0.0.1:1", session=session)

    asyncio.run(make())
    with pytest.raises(ConfigurationError, match="api_key"):
        SearchClient("", base_url="http://127.0.0.1:1")


def test_the_blocking_types_are_exported() -> None:
    for name in (
        "SearchClient",
        "SyncSearchPager",
        "SyncExtractionResults",
        "SyncRawResponseClient",
    ):
        assert name in asyncsearch.__all__


# -- calls -----------------------------------------------------------------------------------


def test_each_method_returns_what_the_async_one_returns(served: EmulatorThread) -> None:
    job_id = served.ids[0]
    log_id = served.emu.webhook_logs(job_id)[0]["id"]
    with served.client() as client:
        page = client.search(page_size=3)
        assert isinstance(page, SearchPage)
        assert len(page.hits) == 3
        assert client.get_extraction(job_id).id == job_id
        assert [log.id for log in client.list_webhook_logs(job_id)]
        assert client.get_webhook_log(job_id, log_id).id == log_id
        assert client.wait_for_extraction(job_id, max_wait=BOUND).id == job_id
        raw = client.with_raw_response.get_extraction(job_id)
        assert isinstance(raw, APIResponse)
        assert raw.status_code == 200
        assert isinstance(raw.parse(), ExtractionJob)
        with pytest.raises(NotFoundError):
            client.get_extraction("00000000-0000-4000-8000-000000000000")
        results = client.gather_extractions(served.ids)
        assert [result.job_id for result in results] == served.ids
        assert all(result.ok for result in results)
        with client.iter_extractions(served.ids[:5], ordered=True) as iterated:
            assert [result.job_id for result in iterated] == served.ids[:5]
        with client.search_hits(page_size=2, max_items=5) as hits:
            assert len(list(hits)) == 5
            assert hits.total is not None
            assert hits.next_page is not None
        pages = list(client.search_pages(page_size=10, max_pages=2))
        assert [len(page.hits) for page in pages] == [10, 10]
        with pytest.raises(InvalidRequestError):
            client.search_hits("x" * 300)  # validated at the call, as the async method does
        with pytest.raises(InvalidRequestError):
            client.gather_extractions(job_id)  # type: ignore[arg-type]  # one id, not many
    assert client.is_closed
    assert "closed" in repr(client)
    assert API_KEY not in repr(client) + repr(client.with_raw_response)
    with pytest.raises(ClientClosedError):
        client.search("x")


def test_a_copy_by_with_options_shares_the_pool_and_closes_alone(served: EmulatorThread) -> None:
    sent: list[str | None] = []

    async def record(request: Any, handler: Any) -> Any:
        sent.append(request.headers.get("X-Copy"))
        return await handler(request)

    with served.client() as client:
        copy = client.with_options(headers={"X-Copy": "1"}, middlewares=[record])
        copy_of_copy = copy.with_options(max_retries=0)
        assert copy.search("x").total is not None
        copy.close()
        assert copy_of_copy.search("x").total is not None  # as AsyncSearchClient's copies
        assert copy.is_closed
        with pytest.raises(ClientClosedError):
            copy.search("x")
        assert client.search("x").total is not None  # the pool is still open
        assert client._runner is copy._runner
    assert sent == ["1", "1"]
    assert copy.is_closed


def test_a_call_runs_in_the_callers_contextvars(served: EmulatorThread) -> None:
    tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="none")
    seen: list[str] = []

    async def middleware(request: Any, handler: Any) -> Any:  # runs on the client's loop
        seen.append(tag.get())
        return await handler(request)

    with served.client(middlewares=[middleware]) as client:
        tag.set("first")
        client.search("x")
        tag.set("second")
        client.gather_extractions(served.ids[:1])

    assert seen == ["first", "second"]


def test_sixteen_threads_share_one_client_its_loop_and_its_pool(served: EmulatorThread) -> None:
    served.call(lambda: served.emu.faults.hold("search"))
    loops: set[int] = set()

    async def middleware(request: Any, handler: Any) -> Any:
        loops.add(id(asyncio.get_running_loop()))
        return await handler(request)

    with served.client(middlewares=[middleware]) as client:
        results: list[Any] = [None] * 16

        def search(index: int) -> None:
            results[index] = client.search(f"query {index}", page_size=1)

        threads = [threading.Thread(target=search, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        # All 16 are on the wire at once: no call waits for another.
        served.run(served.emu.faults.wait_parked(16, "search"))
        served.call(served.emu.faults.release)
        for thread in threads:
            thread.join(BOUND)
        assert all(isinstance(result, SearchPage) for result in results)
        assert len(loops) == 1
        assert sdk_threads().count(LOOP_THREAD) == 1


# -- a loop in the calling thread ------------------------------------------------------------


def test_a_call_from_a_running_loop_works_and_warns_once_per_client(
    served: EmulatorThread,
) -> None:
    async def cell() -> list[int | None]:  # a notebook cell, or async code calling sync code
        with served.client() as client:
            return [client.search("x", page_size=1).total for _ in range(3)]

    with pytest.warns(RuntimeWarning, match="AsyncSearchClient") as warned:
        totals = asyncio.run(cell())
    assert len(totals) == 3
    assert len([w for w in warned if issubclass(w.category, RuntimeWarning)]) == 1


def test_a_call_on_the_clients_own_loop_is_refused(served: EmulatorThread) -> None:
    with served.client() as client:

        def progress(done: int, total: int | None) -> None:  # runs on the client's loop
            client.search("x")

        with pytest.raises(EventLoopMismatchError, match="own loop"):
            client.gather_extractions(served.ids[:1], on_progress=progress)
        assert client.search("x").total is not None  # and the client still works


# -- ids read off the loop, bounded ----------------------------------------------------------


def test_a_blocking_generator_of_ids_leaves_other_calls_going(served: EmulatorThread) -> None:
    go_on = threading.Event()
    read_in: set[str] = set()

    def ids() -> Iterator[str]:
        for number, job_id in enumerate(served.ids):
            read_in.add(threading.current_thread().name)
            if number == 1:
                go_on.wait(BOUND)  # a file or a socket that has nothing to give yet
            yield job_id

    with served.client() as client:
        results: list[Any] = []
        bulk = threading.Thread(target=lambda: results.extend(client.gather_extractions(ids())))
        bulk.start()
        searched: list[Any] = []
        other = threading.Thread(target=lambda: searched.append(client.search("x")))
        other.start()
        other.join(BOUND)
        assert searched, "a call could not run while the ids blocked"
        assert bulk.is_alive()
        go_on.set()
        bulk.join(BOUND)
        assert [result.job_id for result in results] == served.ids
    assert read_in == {"asyncsearch.SearchClient.ids"}
    assert sdk_threads() == []


def test_a_slow_consumer_holds_back_the_requests(served: EmulatorThread) -> None:
    pulled: list[str] = []
    window = threading.Event()
    concurrency = 2
    # In flight plus finished and not taken: 2 * concurrency; one more taken by the consumer,
    # and one more read ahead from the ids.
    bound = 2 * concurrency + 2

    def ids() -> Iterator[str]:
        for job_id in served.ids:
            pulled.append(job_id)
            if len(pulled) == bound:
                window.set()
            yield job_id

    with served.client() as client, client.iter_extractions(ids(), concurrency=2) as results:
        next(results)
        assert window.wait(BOUND)
        client._runner.run(asyncio.sleep(0.05))  # turns for the producer, were it running on
        assert len(pulled) == bound
        assert len(list(results)) == len(served.ids) - 1


# -- leaving early ---------------------------------------------------------------------------


@pytest.mark.parametrize("kept", [False, True], ids=["dropped", "closed"])
def test_leaving_search_hits_early_leaves_nothing_on_the_loop(
    served: EmulatorThread, kept: bool
) -> None:
    served.call(lambda: served.emu.faults.hold("search", after=1))  # the prefetch is held
    with served.client() as client:
        hits = client.search_hits(page_size=2)
        for _hit in hits:
            break
        served.run(served.emu.faults.wait_parked(1, "search"))
        assert left_on_loop(client, settle=False) == ["asyncsearch.pager.prefetch"]
        if kept:
            hits.close()
        else:
            del hits, _hit
            gc.collect()
        assert left_on_loop(client) == []


def test_leaving_iter_extractions_early_leaves_nothing_on_the_loop(
    served: EmulatorThread,
) -> None:
    served.call(lambda: served.emu.faults.hold("extract", after=1))
    with served.client() as client:
        for _result in client.iter_extractions(served.ids, concurrency=4):
            break
        gc.collect()
        assert left_on_loop(client) == []


# -- closing ---------------------------------------------------------------------------------


def test_close_ends_calls_in_flight_and_leaves_no_thread(served: EmulatorThread) -> None:
    served.call(served.emu.faults.hold)
    client = served.client()
    failed: list[BaseException] = []

    def calling(call: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            try:
                call()
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    inside = threading.Event()

    async def stuck(request: Any, handler: Any) -> Any:  # closing the pool does not end it
        inside.set()
        await asyncio.Event().wait()

    endless = itertools.cycle(served.ids)  # read in a thread of its own, never exhausted
    callers = [
        calling(lambda: client.gather_extractions(endless)),
        calling(lambda: client.search("x")),
        calling(lambda: client.get_extraction(served.ids[0], middlewares=[stuck])),
    ]
    served.run(served.emu.faults.wait_parked(1, "extract"))
    served.run(served.emu.faults.wait_parked(1, "search"))
    assert inside.wait(BOUND)
    client.close()  # what is still running then is cancelled: ClientClosedError all the same
    assert sdk_threads() == []
    for caller in callers:
        caller.join(BOUND)
    assert [type(exc) for exc in failed] == [ClientClosedError] * 3
    client.close()  # again: nothing


def test_an_unclosed_client_dropped_warns_and_ends_its_thread(served: EmulatorThread) -> None:
    held = [served.client()]
    held[0].search("x")
    (thread,) = [t for t in threading.enumerate() if t.name == LOOP_THREAD]
    with pytest.warns(ResourceWarning, match="unclosed SearchClient"):
        held.clear()  # its last reference: collected at once
    thread.join(BOUND)
    assert not thread.is_alive()


# -- in a process of its own: exit, Ctrl-C, fork ---------------------------------------------


def _script(source: str, served: EmulatorThread) -> subprocess.Popen[str]:
    names = f"KEY, URL, SCALE = {API_KEY!r}, {served.emu.base_url!r}, {TIME_SCALE}\n"
    prelude = "import asyncsearch\n" + names
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONASYNCIODEBUG")}
    return subprocess.Popen(
        [sys.executable, "-c", prelude + source],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finished(process: subprocess.Popen[str], timeout: float) -> list[str]:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert "Exception ignored" not in err
    return out.split()


_NEVER_CLOSED = """
client = asyncsearch.SearchClient(KEY, base_url=URL)
client.search("x")
unused = asyncsearch.SearchClient(KEY, base_url=URL)
print("searched")
"""


def test_a_script_that_never_closes_its_client_exits(served: EmulatorThread) -> None:
    assert _finished(_script(_NEVER_CLOSED, served), 10 * TIME_SCALE) == ["searched"]


_CTRL_C = """
import asyncio, signal, threading, time, uuid

client = asyncsearch.SearchClient(KEY, base_url=URL)
ids = [str(uuid.UUID(int=n, version=4)) for n in range(1, 5001)]
signalled = []

def interrupt(number, frame):
    signalled.append(time.monotonic())
    raise KeyboardInterrupt

signal.signal(signal.SIGINT, interrupt)
try:
    client.gather_extractions(ids, concurrency=64)
except KeyboardInterrupt:
    print(time.monotonic() - signalled[0] < 1.0 * SCALE)

async def left():
    here = asyncio.current_task()
    names = [t.get_name() for t in asyncio.all_tasks() if t is not here]
    return [name for name in names if name.startswith("asyncsearch.") and "main" not in name]

print(client._runner.run(left()) == [])
print(len(client._ready()._shared.transport._session.connector._acquired) == 0)
print(client.search("x").total is not None)
client.close()
print([t.name for t in threading.enumerate() if t.name.startswith("asyncsearch")] == [])
"""


def test_ctrl_c_cancels_a_bulk_call_at_once_and_the_client_goes_on(
    served: EmulatorThread,
) -> None:
    served.call(lambda: served.emu.faults.hold("extract"))
    process = _script(_CTRL_C, served)
    try:
        served.run(served.emu.faults.wait_parked(64, "extract"))
        process.send_signal(signal.SIGINT)
    except BaseException:
        process.kill()
        raise
    assert _finished(process, 20 * TIME_SCALE) == ["True"] * 5


_FORKED = """
import os, threading

client = asyncsearch.SearchClient(KEY, base_url=URL)
copy = client.with_options(max_retries=0)
client.search("x")
parent_loop = client._runner.running[1]
pid = os.fork()
if pid == 0:
    copy.search("y")
    client.search("z")
    print(client._runner.running[1] is not parent_loop, threading.current_thread() is not None)
    client.close()
    os._exit(0)
os.waitpid(pid, 0)
print(client.search("after").total is not None)
client.close()
"""


def test_a_client_made_before_fork_works_in_the_child(served: EmulatorThread) -> None:
    assert _finished(_script(_FORKED, served), 20 * TIME_SCALE) == ["True", "True", "True"]
    assert served.emu.stats.count("search") == 4
