"""asyncsearch.ray on a real local Ray (``ray.init(num_cpus=2)``) against the emulator.

Marked ``ray`` and skipped when Ray is not installed (the ``ray`` extra; CI installs it in a step
of its own). Ray starts once per test session (about 10 s). The emulator runs on its own event
loop in a thread of the test process, serving on 127.0.0.1: the Ray workers are other
processes and reach it over loopback while the test's thread blocks on Ray. Each test works in
a base of its own, so the tests share one emulator without seeing each other's data.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator

T = TypeVar("T")

HAVE_RAY = importlib.util.find_spec("ray") is not None
KEY = "ray-test-key"

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        not HAVE_RAY,
        reason=(
            "Ray is not installed: install the ray extra (pip install -e '.[ray]'); CI skips "
            f"these tests only where Ray has no wheel for Python "
            f"{sys.version_info.major}.{sys.version_info.minor}"
        ),
    ),
    # Ray's start-up (once per session) counts against the first test.
    pytest.mark.timeout(300),
    # Ray warns about its own deprecated settings when a DataContext is made; not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


class ThreadedEmulator:
    """A ``ServiceEmulator`` running on its own event loop in a thread of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="test-emulator", daemon=True
        )
        self.emu = ServiceEmulator(api_key=KEY)

    def call(self, coroutine: Awaitable[T]) -> T:
        """Run a coroutine on the emulator's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)  # type: ignore[arg-type]

    def do(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a method of the emulator on its loop's thread (it is not thread-safe)."""

        async def run() -> T:
            return function(*args, **kwargs)

        return self.call(run())

    def start(self) -> None:
        self.thread.start()
        self.call(self.emu.start())

    def stop(self) -> None:
        try:
            self.call(self.emu.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()


@pytest.fixture(scope="session")
def _ray_for_the_session() -> Iterator[None]:
    """Shut down at the end of the session whatever Ray the tests started."""
    yield None
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_session(_ray_for_the_session: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A local Ray (``ray.init(num_cpus=2)``), started once and kept for the next tests.

    Started here when it is not running, rather than once in a session fixture: the README test
    (tests/test_readme.py, also marked ``ray``) runs the README's own ``ray.init(...)`` and
    ``ray.shutdown()``, so it shuts down a Ray it finds running first, and random test order may
    put it between two of these tests.

    Ray starts its workers (the actors included) at niceness 15: next to any other busy process
    they get a few percent of a core, and on a 2-core machine kept busy by two CPU burners these
    tests took over ten times as long. At niceness 0 (``RAY_worker_niceness``, read when Ray
    starts) they get a fair share, as the test process does.
    """
    import ray
    import ray.data

    if not ray.is_initialized():
        monkeypatch.setenv("RAY_worker_niceness", "0")
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


@pytest.fixture(scope="session")
def served() -> Iterator[ThreadedEmulator]:
    threaded = ThreadedEmulator()
    threaded.start()
    try:
        yield threaded
    finally:
        threaded.stop()


@pytest.fixture
def emu(served: ThreadedEmulator) -> Iterator[ThreadedEmulator]:
    served.do(served.emu.faults.clear)
    yield served
    served.do(served.emu.faults.clear)


@pytest.fixture
def base_id() -> str:
    return f"ray-{uuid.uuid4()}"


def _extract_requests(emu: ThreadedEmulator, base_id: str) -> int:
    def count() -> int:
        return sum(1 for r in emu.emu.requests if r.endpoint == "extract" and r.base_id == base_id)

    return emu.do(count)


def _fetch(
    ray: Any,
    ids: list[str | None],
    *,
    emu: ThreadedEmulator,
    base_id: str,
    batch_format: str = "pyarrow",
    **options: Any,
) -> Any:
    from asyncsearch.ray import FetchExtractions

    dataset = ray.data.from_items([{"job_id": i} for i in ids], override_num_blocks=8)
    return dataset.map_batches(
        FetchExtractions,
        fn_constructor_kwargs={
            "api_key": KEY,
            "base_url": emu.emu.base_url,
            "base_id": base_id,
            "concurrency": 16,
            **options,
        },
        batch_size=100,
        batch_format=batch_format,
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0.25,
    )


def test_fetch_extractions_every_id_once_with_404s_and_503s_as_values(
    ray_session: Any, emu: ThreadedEmulator, base_id: str
) -> None:
    known = {
        job["id"]: job
        for job in (emu.do(emu.emu.add_job, state="done", base_id=base_id) for _ in range(1500))
    }
    unknown = [str(uuid.uuid4()) for _ in range(500)]
    ids = [*known, *unknown]
    # The first 60 extraction requests get a 503; without retries each is an error row.
    emu.do(emu.emu.faults.script, "extract", [503] * 60)

    rows = _fetch(ray_session, ids, emu=emu, base_id=base_id, max_retries=0).take_all()

    assert Counter(row["job_id"] for row in rows) == Counter(ids)  # every id exactly once
    assert set(rows[0]) == {"job_id", "state", "extraction", "error"}
    by_id = {row["job_id"]: row for row in rows}
    unavailable = {i for i, row in by_id.items() if (row["error"] or "").startswith("Internal")}
    assert len(unavailable) == 60
    for job_id, row in by_id.items():
        if job_id in unavailable:
            assert row["error"].startswith("InternalServerError: ")
            assert "503" in row["error"]
            assert row["state"] is None
            assert row["extraction"] is None
        elif job_id in known:
            assert row["error"] is None
            assert row["state"] == "done"
            extraction = json.loads(row["extraction"])
            expected = known[job_id]["extraction"]
            assert extraction["common"]["thumbnail"] == expected["common"]["thumbnail"]
            assert extraction["media"]["screenshot"] == expected["media"]["screenshot"]
        else:
            assert row["error"].startswith("NotFoundError: ")
            assert row["state"] is None
            assert row["extraction"] is None
    assert KEY not in json.dumps(rows)
    assert _extract_requests(emu, base_id) == len(ids)  # one request per id (no retries)


def test_fetch_extractions_bad_ids_are_error_rows(
    ray_session: Any, emu: ThreadedEmulator, base_id: str
) -> None:
    job = emu.do(emu.emu.add_job, state="pending", extraction=None, base_id=base_id)
    ids = [job["id"], "not-a-uuid", None, job["id"]]

    # numpy batches (Ray's default format) as well as pyarrow ones.
    rows = _fetch(ray_session, ids, emu=emu, base_id=base_id, batch_format="numpy").take_all()

    assert Counter(row["job_id"] for row in rows) == Counter(ids)
    bad = [row for row in rows if row["job_id"] == "not-a-uuid"]
    assert bad[0]["error"].startswith("InvalidRequestError: ")
    null = [row for row in rows if row["job_id"] is None]
    assert null[0]["error"] == "InvalidRequestError: job_id must be a string, got null"
    good = [row for row in rows if row["job_id"] == job["id"]]
    outcome = [(r["state"], r["extraction"], r["error"]) for r in good]
    assert outcome == [("pending", None, None)] * 2


def test_fetch_extractions_options_concurrency_budget_and_key_from_env(
    ray_session: Any, emu: ThreadedEmulator, base_id: str
) -> None:
    from asyncsearch import RetryBudget
    from asyncsearch.ray import FetchExtractions

    ids = [emu.do(emu.emu.add_job, state="done", base_id=base_id)["id"] for _ in range(150)]
    emu.do(emu.emu.faults.set, "extract", latency=0.02)
    emu.do(emu.emu.faults.script, "extract", [503] * 20)
    emu.do(emu.emu.stats.reset)

    # No key or URL given: the actor reads them from its environment, as on a cluster.
    rows = (
        ray_session.data.from_items([{"job_id": i} for i in ids], override_num_blocks=6)
        .map_batches(
            FetchExtractions,
            fn_constructor_kwargs={
                "base_id": base_id,
                "concurrency": 3,
                "max_retries": 2,
                "retry_budget": RetryBudget(capacity=0),  # so no retry is allowed
            },
            batch_size=25,
            batch_format="pyarrow",
            compute=ray_session.data.ActorPoolStrategy(size=1),
            num_cpus=0.25,
            runtime_env={
                "env_vars": {"ASYNCSEARCH_API_KEY": KEY, "ASYNCSEARCH_BASE_URL": emu.emu.base_url}
            },
        )
        .take_all()
    )

    assert Counter(row["job_id"] for row in rows) == Counter(ids)
    errors = [row["error"] for row in rows if row["error"] is not None]
    assert len(errors) == 20
    assert all(error.startswith("InternalServerError: ") for error in errors)
    assert _extract_requests(emu, base_id) == len(ids)  # the empty budget refused every retry
    # Ray runs several batches at once on the actor: the limit holds across all of them.
    assert emu.do(lambda: emu.emu.stats.max_in_flight_by_endpoint["extract"]) <= 3


def _expected_pages(emu: ThreadedEmulator, base_id: str, **search: Any) -> list[Any]:
    async def walk() -> list[Any]:
        async with AsyncSearchClient(KEY, base_url=emu.emu.base_url, base_id=base_id) as client:
            return [page async for page in client.search_pages(**search)]

    return asyncio.run(walk())


@pytest.mark.parametrize(
    "search",
    [
        {"filters": {}, "page_size": 40},
        {"text": "invoice budget harbor", "page_size": 5},
    ],
    ids=["all", "text"],
)
def test_read_search_hits_with_tensor_columns(
    ray_session: Any, emu: ThreadedEmulator, base_id: str, search: dict[str, Any]
) -> None:
    import numpy as np

    from asyncsearch.ray import read_search

    emu.do(emu.emu.seed, n_resources=110, n_jobs=0, seed=5, base_id=base_id)
    pages = _expected_pages(emu, base_id, **search)
    hits = [hit for page in pages for hit in page.hits]
    assert len(pages) >= 2
    assert hits

    dataset = read_search(api_key=KEY, base_url=emu.emu.base_url, base_id=base_id, **search)
    batches = list(dataset.iter_batches(batch_format="numpy", batch_size=None))

    assert dataset.schema().names == ["id", "name", "score", "small3_512", "clip2"]
    ids = [i for batch in batches for i in batch["id"].tolist()]
    assert ids == [hit.id for hit in hits]
    assert [n for b in batches for n in b["name"].tolist()] == [hit.name for hit in hits]
    assert [s for b in batches for s in b["score"].tolist()] == [hit.score for hit in hits]
    for name, width in (("small3_512", 512), ("clip2", 768)):
        column = np.concatenate([batch[name] for batch in batches])
        assert column.dtype == np.float32
        assert column.shape == (len(hits), width)
        expected = np.concatenate([page.embedding_matrix(name) for page in pages])
        np.testing.assert_array_equal(column, expected)


def test_read_search_checks_arguments_before_sending(emu: ThreadedEmulator) -> None:
    from asyncsearch import ConfigurationError, InvalidRequestError
    from asyncsearch.ray import read_search

    before = emu.do(emu.emu.stats.count)
    with pytest.raises(InvalidRequestError):
        read_search("x" * 300, api_key=KEY, base_url=emu.emu.base_url)
    with pytest.raises(ConfigurationError):
        read_search("x", api_key=KEY, base_url="ftp://example.com")
    assert emu.do(emu.emu.stats.count) == before


@pytest.mark.parametrize("output", ["parquet", "json"])
def test_resume_fetches_only_unwritten_ids(
    ray_session: Any, emu: ThreadedEmulator, base_id: str, tmp_path: Path, output: str
) -> None:
    from asyncsearch.ray import unwritten_job_ids

    known = [emu.do(emu.emu.add_job, state="done", base_id=base_id)["id"] for _ in range(250)]
    ids = [*known, *(str(uuid.uuid4()) for _ in range(50))]
    out = str(tmp_path / "out")

    def read_ids() -> Any:
        return ray_session.data.from_items([{"job_id": i} for i in ids], override_num_blocks=4)

    def export(todo: Any, **options: Any) -> None:
        from asyncsearch.ray import FetchExtractions

        fetched = todo.map_batches(
            FetchExtractions,
            fn_constructor_kwargs={
                "api_key": KEY,
                "base_url": emu.emu.base_url,
                "base_id": base_id,
                **options,
            },
            batch_size=50,
            batch_format="pyarrow",
            compute=ray_session.data.ActorPoolStrategy(size=2),
            num_cpus=0.25,
        )
        getattr(fetched, f"write_{output}")(out)

    def written() -> list[dict[str, Any]]:
        reader = getattr(ray_session.data, f"read_{output}")
        return reader(out).take_all()  # type: ignore[no-any-return]

    # Nothing written yet: every id is to do.
    assert unwritten_job_ids(read_ids(), out, format=output).count() == len(ids)

    # A first run that wrote only part of the ids (as if it had been stopped), some with 503s.
    emu.do(emu.emu.faults.script, "extract", [503] * 10)
    export(read_ids().limit(120), max_retries=0)
    first = written()
    assert len(first) == 120

    # The re-run fetches only what is missing, and the output then holds every id once.
    before = _extract_requests(emu, base_id)
    export(unwritten_job_ids(read_ids(), out, format=output))
    assert _extract_requests(emu, base_id) - before == len(ids) - 120
    assert Counter(row["job_id"] for row in written()) == Counter(ids)

    # retry_failed fetches again exactly the ids written with an error.
    failed = {row["job_id"] for row in written() if row["error"] is not None}
    assert sum(1 for row in first if (row["error"] or "").startswith("Internal")) == 10
    todo = unwritten_job_ids(read_ids(), out, format=output, retry_failed=True)
    assert sorted(row["job_id"] for row in todo.take_all()) == sorted(failed)


def test_ray_export_benchmark_runs_quick(
    ray_session: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/ray_export.py cannot rot: it runs to the end in --quick mode (no figure is
    asserted) and leaves no emulator process behind."""
    import os
    import re

    from benchmarks import ray_export

    def children() -> set[int]:
        found: set[int] = set()
        for path in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
            found.update(int(pid) for pid in path.read_text().split())
        return found

    before = children()
    results = tmp_path / "ray_export.json"

    assert ray_export.main(["--quick", "--json", str(results)]) == 0

    out = capsys.readouterr().out
    assert re.search(r"^\| 2 actors +\| +[\d,]+ \| +\d+\.\d\dx \|", out, flags=re.MULTILINE)
    assert re.search(r"^\s*(PASS|MISS) 2 actors", out, flags=re.MULTILINE)
    assert "machine: " in out
    assert json.loads(results.read_text())["benchmark"] == "ray_export"
    assert children() <= before, "the emulator process was left running"


def test_resume_reads_what_was_written_at_a_uri(ray_session: Any, tmp_path: Path) -> None:
    # Remote storage (s3://, gs://) is given as a URI, where os.path finds nothing: resuming
    # used to fetch every id again and write each one twice. file:// goes the same way.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from asyncsearch.ray import EXTRACTION_SCHEMA, unwritten_job_ids

    out = tmp_path / "out"
    out.mkdir()
    written = {"job_id": ["a", "b", "c"], "state": ["done"] * 3, "extraction": [None] * 3}
    written["error"] = [None, None, "InternalServerError: 503"]
    pq.write_table(pa.Table.from_pydict(written, schema=EXTRACTION_SCHEMA), out / "0.parquet")
    ids = ray_session.data.from_items([{"job_id": i} for i in "abcd"])

    def todo(path: str, **options: Any) -> list[str]:
        return sorted(row["job_id"] for row in unwritten_job_ids(ids, path, **options).take_all())

    assert out.as_uri().startswith("file://")
    assert todo(out.as_uri()) == ["d"]
    assert todo(out.as_uri(), retry_failed=True) == ["c", "d"]
    assert todo((out / "0.parquet").as_uri()) == ["d"]
    # A URI with nothing there yet (missing, or an empty folder) means nothing is written.
    (tmp_path / "empty").mkdir()
    assert todo((tmp_path / "missing").as_uri()) == ["a", "b", "c", "d"]
    assert todo((tmp_path / "empty").as_uri()) == ["a", "b", "c", "d"]


def test_search_walk_closes_the_client_when_closing_the_pager_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from asyncsearch.ray import _SearchWalk

    task_names: list[str] = []
    closed: list[AsyncSearchClient] = []

    def record() -> None:
        task = asyncio.current_task()
        task_names.append(task.get_name() if task is not None else "no task")

    class FailingPager:
        async def __anext__(self) -> Any:
            record()
            raise StopAsyncIteration

        async def aclose(self) -> None:
            record()
            raise RuntimeError("closing the pager failed")

    original_aclose = AsyncSearchClient.aclose

    async def aclose(self: AsyncSearchClient) -> None:
        record()
        closed.append(self)
        await original_aclose(self)

    monkeypatch.setattr(AsyncSearchClient, "search_pages", lambda self, **_: FailingPager())
    monkeypatch.setattr(AsyncSearchClient, "aclose", aclose)
    walk = _SearchWalk({"api_key": KEY, "base_url": "http://127.0.0.1:9"}, {"text": "x"})
    with pytest.raises(RuntimeError, match="closing the pager failed"):
        list(walk({"walk": [0]}))
    assert len(closed) == 1
    # The tasks asyncsearch.ray starts on the walk's loop are named like every SDK task.
    assert task_names == ["asyncsearch.ray.read_search"] * 3


def test_client_options_are_every_option_that_can_go_to_another_process() -> None:
    import inspect

    from asyncsearch import InvalidRequestError
    from asyncsearch.ray import ClientOptions, FetchExtractions

    keywords = set(inspect.signature(AsyncSearchClient.__init__).parameters) - {"self"}
    # api_key and base_url are parameters of their own; a session or an SSL context cannot be
    # sent to another process.
    assert set(ClientOptions.__optional_keys__) == keywords - {
        "api_key",
        "base_url",
        "session",
        "ssl",
    }
    with pytest.raises(InvalidRequestError, match="format must be one of json, markdown"):
        FetchExtractions(api_key=KEY, format="xml")  # type: ignore[arg-type]


def test_ray_workers_run_at_niceness_0(ray_session: Any) -> None:
    """The workers these tests start get a fair share of a busy machine (see ray_session): a
    Ray that stops reading ``RAY_worker_niceness`` would make CI's Ray step crawl again."""
    import os

    @ray_session.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray_session.get(niceness.remote(), timeout=120) == 0


def test_ray_module_uses_only_the_public_api() -> None:
    import ast

    import asyncsearch.ray

    tree = ast.parse(Path(asyncsearch.ray.__file__).read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert [name for name in imported if name.startswith("asyncsearch._")] == []
