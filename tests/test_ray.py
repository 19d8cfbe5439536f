"""asyncsearch.ray on a real local Ray (``ray.init(num_cpus=2)``) against the emulator.

Marked ``ray`` and skipped when Ray is not installed (the ``ray`` extra; CI installs it in a step
of its own). Ray starts once per test session (about 10 s). The emulator runs on its own event
loop in a thread of the test process, serving on 127.0.0.1: the Ray workers are other
processes and reach it over loopback while the test's thread blocks on Ray. Each test works in
a base of its own, so the tests share one emulator without seeing each other's data.
"""

from __future__ import annotations

import asyncio
import bisect
import importlib.util
import json
import math
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator

from .helpers import TIME_SCALE

T = TypeVar("T")
#: The formats FetchExtractions' output is written in (write_parquet, write_json).
Output = Literal["parquet", "json"]

HAVE_RAY = importlib.util.find_spec("ray") is not None
KEY = "ray-test-key"

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        not HAVE_RAY,
        # Only what is true wherever it is read: CI's own Ray step installs the extra (and says
        # so when Ray has no wheel for its Python); this run simply has no Ray.
        reason="Ray is not installed here: install the ray extra (pip install -e '.[ray]')",
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
def test_read_search_hits_with_the_columns_of_search_table(
    ray_session: Any, emu: ThreadedEmulator, base_id: str, search: dict[str, Any]
) -> None:
    import numpy as np
    import pyarrow as pa

    from asyncsearch.arrow import EMBEDDING_NAMES, HIT_COLUMNS
    from asyncsearch.ray import read_search

    emu.do(emu.emu.seed, n_resources=110, n_jobs=0, seed=5, base_id=base_id)
    pages = _expected_pages(emu, base_id, **search)
    hits = [hit for page in pages for hit in page.hits]
    assert len(pages) >= 2
    assert hits

    dataset = read_search(api_key=KEY, base_url=emu.emu.base_url, base_id=base_id, **search)
    table = pa.concat_tables(dataset.iter_batches(batch_format="pyarrow", batch_size=None))

    assert table.schema.names == [name for name, _ in HIT_COLUMNS] + list(EMBEDDING_NAMES)
    for name, _ in HIT_COLUMNS:
        assert table.column(name).to_pylist() == [getattr(hit, name) for hit in hits], name
    # The vectors as a model takes them: numpy batches hold each vector column as one 2-D
    # float32 array (with fixed_size_list columns they were 1-D object arrays of arrays).
    batches = list(dataset.iter_batches(batch_format="numpy", batch_size=7))
    for name in EMBEDDING_NAMES:
        expected = np.concatenate([page.embedding_matrix(name) for page in pages])
        assert expected.shape[1] > 0
        for batch in batches:
            matrix = batch[name]
            assert isinstance(matrix, np.ndarray), name
            assert (matrix.dtype, matrix.ndim) == (np.float32, 2), name
        np.testing.assert_array_equal(np.concatenate([b[name] for b in batches]), expected)


def test_read_search_checks_arguments_before_sending(emu: ThreadedEmulator) -> None:
    from asyncsearch import ConfigurationError, InvalidRequestError
    from asyncsearch.ray import read_search

    before = emu.do(emu.emu.stats.count)
    with pytest.raises(InvalidRequestError):
        read_search("x" * 300, api_key=KEY, base_url=emu.emu.base_url)
    with pytest.raises(ConfigurationError):
        read_search("x", api_key=KEY, base_url="ftp://example.com")
    for widths in ({"clip3": 5}, {"clip2": -1}, {"clip2": 5.0}, {"clip2": True}, [("clip2", 5)]):
        with pytest.raises(InvalidRequestError, match="embedding_widths"):
            read_search("x", api_key=KEY, base_url=emu.emu.base_url, embedding_widths=widths)  # type: ignore[arg-type]
    assert emu.do(emu.emu.stats.count) == before


def _hit(hit_id: str, **embeddings: list[float]) -> dict[str, Any]:
    """A search hit in the wire form, with only the embeddings given (none: no ``embeddings``)."""
    hit: dict[str, Any] = {"id": hit_id, "name": f"resource {hit_id}", "score": 0.5}
    if embeddings:
        hit["embeddings"] = embeddings
    return hit


def _canned_search(pages: list[list[dict[str, Any]]]) -> Any:
    """A search service on 127.0.0.1 whose ``POST /v2/search`` answers with ``pages`` (page 1
    first), served from a thread of this process: Ray's workers reach it over loopback."""
    from aiohttp import web

    from .helpers import ThreadedServer

    async def search(request: web.Request) -> web.Response:
        body = await request.json()
        number = int((body.get("pagination") or {}).get("page", 1))
        hits = pages[number - 1] if 1 <= number <= len(pages) else []
        total = sum(len(page) for page in pages)
        return web.json_response({"total": total, "hasMore": number < len(pages), "hits": hits})

    app = web.Application()
    app.router.add_post("/v2/search", search)
    return ThreadedServer(app)


def test_read_search_takes_the_embedding_widths_from_the_data(ray_session: Any) -> None:
    import numpy as np

    from asyncsearch import ResponseValidationError
    from asyncsearch.ray import read_search

    small = {n: [float(n), n + 0.5, -float(n)] for n in range(5)}  # 3 values, where 512 were fixed
    clip = {n: [n / 4, 1.0, 2.0, 3.0, -n / 4] for n in range(5)}  # 5 values, where 768 were
    pages = [
        # No hit of the first page has a clip2 vector: its width is known from page 2 on.
        [_hit("a", small3_512=small[0]), _hit("b", small3_512=small[1])],
        [_hit("c", small3_512=small[2], clip2=clip[2]), _hit("d")],
        [_hit("e", small3_512=small[4], clip2=clip[4])],
    ]
    with _canned_search(pages) as server:
        dataset = read_search("q", api_key=KEY, base_url=server.base_url)
        batch = _all_hits(dataset)

    def f32(rows: list[list[float] | None], width: int) -> Any:
        # A hit without the vector: a row of NaN, as SearchPage.embedding_matrix gives it.
        return np.array([[np.nan] * width if r is None else r for r in rows], dtype=np.float32)

    assert list(batch["id"]) == list("abcde")
    expected = {
        "small3_512": f32([small[0], small[1], small[2], None, small[4]], 3),
        "clip2": f32([None, None, clip[2], None, clip[4]], 5),
    }
    for name, matrix in expected.items():
        assert batch[name].dtype == np.float32
        np.testing.assert_array_equal(batch[name], matrix)

    # The caller may say a width instead; a vector that disagrees with it fails the read.
    with _canned_search(pages) as server:
        given = read_search(
            "q", api_key=KEY, base_url=server.base_url, embedding_widths={"clip2": 5}
        )
        rows = given.take_all()
        wrong = read_search(
            "q", api_key=KEY, base_url=server.base_url, embedding_widths={"clip2": 6}
        )
        with pytest.raises(ResponseValidationError, match=r"\(as embedding_widths gives\)"):
            wrong.take_all()
    np.testing.assert_array_equal(np.stack([row["clip2"] for row in rows]), expected["clip2"])


def _all_hits(dataset: Any) -> dict[str, Any]:
    """Every row of ``dataset`` as one numpy batch (column name to array)."""
    import numpy as np

    batches = list(dataset.iter_batches(batch_format="numpy", batch_size=None))
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def test_read_search_follows_the_arrow_rule_for_a_vector_column_that_comes_late(
    ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The walk of test_arrow's late-vector test: clip2 vectors only after the look-ahead. The
    # read used to fail at hit 10,000; now it gives search_table's documented result.
    import numpy as np

    import asyncsearch.ray
    from asyncsearch.arrow import MAX_HELD_HITS
    from asyncsearch.ray import _SearchWalk, read_search

    from .test_arrow import (
        LATE_CLIP2,
        LATE_HITS,
        LATE_PAGE_SIZE,
        CountingHitBatches,
        check_late_vector_result,
        late_vector_pages,
    )

    pages = late_vector_pages()
    with _canned_search(pages) as server:
        batch = _all_hits(read_search("q", api_key=KEY, base_url=server.base_url))
        check_late_vector_result(list(batch["id"]), batch["small3_512"], batch["clip2"])
        assert (batch["small3_512"].dtype, batch["clip2"].dtype) == (np.float32, np.float32)

        # The read task's walk, run here to count the pages it holds back: the same bound as
        # search_table's.
        CountingHitBatches.made.clear()
        monkeypatch.setattr(asyncsearch.ray, "HitBatches", CountingHitBatches)
        walk = _SearchWalk({"api_key": KEY, "base_url": server.base_url}, {"text": "q"})
        rows = sum(block.num_rows for block in walk({"walk": [0]}))
    assert rows == LATE_HITS
    (builder,) = CountingHitBatches.made
    look_ahead = MAX_HELD_HITS // LATE_PAGE_SIZE
    assert len(builder.held_after_each_page) == len(pages)
    assert max(builder.held_after_each_page) == look_ahead - 1
    assert builder.held_after_each_page[look_ahead - 1 :] == [0] * (len(pages) - look_ahead + 1)
    assert builder.left_out == {"clip2": LATE_HITS - LATE_CLIP2}


def test_read_search_refuses_an_embedding_of_another_width(ray_session: Any) -> None:
    from asyncsearch import ResponseValidationError
    from asyncsearch.ray import read_search

    pages = [[_hit("a", clip2=[1.0] * 5)], [_hit("b", clip2=[1.0] * 4)]]
    with _canned_search(pages) as server:
        dataset = read_search("q", api_key=KEY, base_url=server.base_url)
        # The read task's typed error reaches the driver as itself.
        with pytest.raises(ResponseValidationError) as info:
            dataset.take_all()
    assert info.value.path == "$.hits[*].embeddings.clip2"
    assert (
        "hit 'b' has 4 clip2 values, where this walk's clip2 column has 5"
        " (the width of hit 'a', the first with one)"
    ) in str(info.value)


def test_read_search_errors_reach_the_driver_typed(
    ray_session: Any, emu: ThreadedEmulator, base_id: str
) -> None:
    from asyncsearch import InternalServerError
    from asyncsearch.ray import read_search

    emu.do(emu.emu.seed, n_resources=20, n_jobs=0, seed=5, base_id=base_id)
    emu.do(emu.emu.faults.script, "search", [500])
    dataset = read_search(
        "invoice", api_key=KEY, base_url=emu.emu.base_url, base_id=base_id, max_retries=0
    )
    with pytest.raises(InternalServerError) as info:
        dataset.take_all()
    assert info.value.status_code == 500
    assert KEY not in str(info.value)


def _export(
    ray: Any,
    todo: Any,
    out: str,
    output: Output,
    *,
    emu: ThreadedEmulator,
    base_id: str,
    **options: Any,
) -> None:
    """Fetch the jobs of ``todo`` and write them to ``out`` (``write_parquet``/``write_json``)."""
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
        # One actor: these tests check what is written; the FetchExtractions tests use two.
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.25,
    )
    getattr(fetched, f"write_{output}")(out)


def _written(ray: Any, out: str | Path, output: Output) -> list[dict[str, Any]]:
    """Every row in ``out``, as a reader that knows nothing of asyncsearch reads them.

    Parquet is read with pyarrow's dataset reader, the one under Ray's ``read_parquet`` (which
    skips hidden files alike), because Ray's own spends seconds on tasks that sample the files
    before each read; ``unwritten_job_ids`` reads the output with Ray's in every test that
    resumes. JSON lines are read with Ray's ``read_json``.
    """
    if output == "parquet":
        import pyarrow.dataset as ds

        return ds.dataset(str(out), format="parquet").to_table().to_pylist()  # type: ignore[no-any-return]
    return ray.data.read_json(str(out)).take_all()  # type: ignore[no-any-return]


@pytest.mark.parametrize("output", ["parquet", "json"])
def test_resume_fetches_only_unwritten_ids(
    ray_session: Any, emu: ThreadedEmulator, base_id: str, tmp_path: Path, output: Output
) -> None:
    from asyncsearch.ray import unwritten_job_ids

    known = [emu.do(emu.emu.add_job, state="done", base_id=base_id)["id"] for _ in range(250)]
    ids = [*known, *(str(uuid.uuid4()) for _ in range(50))]
    out = str(tmp_path / "out")

    def read_ids() -> Any:
        return ray_session.data.from_items([{"job_id": i} for i in ids], override_num_blocks=4)

    def export(todo: Any, **options: Any) -> None:
        _export(ray_session, todo, out, output, emu=emu, base_id=base_id, **options)

    def written() -> list[dict[str, Any]]:
        return _written(ray_session, out, output)

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

    # retry_failed fetches again exactly the ids written with an error...
    failed = {row["job_id"] for row in written() if row["error"] is not None}
    assert sum(1 for row in first if (row["error"] or "").startswith("Internal")) == 10
    todo = unwritten_job_ids(read_ids(), out, format=output, retry_failed=True)
    assert sorted(row["job_id"] for row in todo.take_all()) == sorted(failed)
    # ... and takes their rows out of the output: until fetched again, they are not written.
    assert Counter(row["job_id"] for row in written()) == Counter(set(ids) - failed)

    # So after the retry the output holds every id exactly once, for a reader that just reads
    # it: the ids that failed with a 503 once, with their job; the unknown ones, with a 404.
    export(todo)
    rows = written()
    assert Counter(row["job_id"] for row in rows) == Counter(ids)
    errors = {row["job_id"]: row["error"] for row in rows if row["error"] is not None}
    assert sorted(errors) == sorted(ids[250:])
    assert all(error.startswith("NotFoundError: ") for error in errors.values())


@pytest.mark.parametrize("output", ["parquet", "json"])
def test_resume_refetches_the_jobs_written_in_progress(
    ray_session: Any, emu: ThreadedEmulator, base_id: str, tmp_path: Path, output: Output
) -> None:
    from asyncsearch.ray import unwritten_job_ids

    # "processing" (the emulator's) and "ready": states the spec does not name, and so final.
    jobs = {
        state: [emu.do(emu.emu.add_job, state=state, base_id=base_id)["id"] for _ in range(15)]
        for state in ("pending", "processing", "done", "ready")
    }
    in_progress = jobs["pending"]
    unknown = [str(uuid.uuid4()) for _ in range(5)]
    ids = [*(i for state_ids in jobs.values() for i in state_ids), *unknown]
    out = str(tmp_path / "out")

    def read_ids() -> Any:
        return ray_session.data.from_items([{"job_id": i} for i in ids], override_num_blocks=4)

    def todo(**options: Any) -> Any:
        return unwritten_job_ids(read_ids(), out, format=output, **options)

    _export(ray_session, read_ids(), out, output, emu=emu, base_id=base_id)
    assert todo().count() == 0  # by default every row is final, as before

    # The jobs written pending come back, and only those (the 404s come back with retry_failed
    # only; processing is not a state the spec names, so it is final).
    again = todo(refetch_in_progress=True)
    assert sorted(row["job_id"] for row in again.take_all()) == sorted(in_progress)

    # Meanwhile ten of the pending jobs finish; five do not.
    finished, still_pending = jobs["pending"][:10], jobs["pending"][10:]
    for job_id in finished:
        emu.do(emu.emu.set_job_state, job_id, "done", base_id=base_id)
    before = _extract_requests(emu, base_id)
    _export(ray_session, again, out, output, emu=emu, base_id=base_id)
    assert _extract_requests(emu, base_id) - before == len(in_progress)

    # Every id is in the output exactly once, with its newest state.
    rows = _written(ray_session, out, output)
    assert Counter(row["job_id"] for row in rows) == Counter(ids)
    states = {row["job_id"]: row["state"] for row in rows}
    assert {states[i] for i in finished} == {"done"}
    assert {states[i] for i in still_pending} == {"pending"}
    assert {states[i] for i in jobs["processing"]} == {"processing"}
    assert {states[i] for i in jobs["ready"]} == {"ready"}
    assert sorted(row["job_id"] for row in todo(refetch_in_progress=True).take_all()) == sorted(
        still_pending
    )
    both = todo(refetch_in_progress=True, retry_failed=True).take_all()
    assert sorted(row["job_id"] for row in both) == sorted([*still_pending, *unknown])


def _write_output(
    folder: Path, output: Output, files: list[list[tuple[str, str | None, str | None]]]
) -> None:
    """Write rows of ``EXTRACTION_SCHEMA`` (job_id, state, error) as FetchExtractions' output,
    one file per list, the way ``write_parquet`` and ``write_json`` write them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from asyncsearch.ray import EXTRACTION_SCHEMA

    folder.mkdir()
    for number, rows in enumerate(files):
        records = [
            {"job_id": job_id, "state": state, "extraction": None, "error": error}
            for job_id, state, error in rows
        ]
        if output == "parquet":
            table = pa.Table.from_pylist(records, schema=EXTRACTION_SCHEMA)
            pq.write_table(table, folder / f"{number}.parquet")
        else:
            lines = (json.dumps(record, separators=(",", ":")) + "\n" for record in records)
            (folder / f"{number}.json").write_text("".join(lines))


@pytest.mark.parametrize("output", ["parquet", "json"])
def test_only_in_progress_states_and_errors_are_fetched_again(
    ray_session: Any, tmp_path: Path, output: Output
) -> None:
    from asyncsearch import IN_PROGRESS_JOB_STATES
    from asyncsearch.ray import unwritten_job_ids

    # A state is final unless IN_PROGRESS_JOB_STATES names it: "done" and "failed" are not
    # special, nor is a state nobody knows or a missing one.
    states = [*sorted(IN_PROGRESS_JOB_STATES), "done", "failed", "ready", None]
    rows: list[tuple[str, str | None, str | None]] = [
        (f"job-{state}", state, None) for state in states
    ]
    rows.append(("job-error", None, "NotFoundError: 404 Not Found from GET /v2/extract/..."))
    ids = ray_session.data.from_items([{"job_id": i} for i, _, _ in rows] + [{"job_id": "new"}])
    in_progress = [f"job-{state}" for state in sorted(IN_PROGRESS_JOB_STATES)]

    def todo(**options: Any) -> list[str]:
        # A fresh output each time: asking with an option takes the rows it names out.
        out = tmp_path / f"out-{uuid.uuid4()}"
        _write_output(out, output, [rows])
        found = unwritten_job_ids(ids, str(out), format=output, **options).take_all()
        return sorted(row["job_id"] for row in found)

    assert todo() == ["new"]
    assert todo(refetch_in_progress=True) == sorted([*in_progress, "new"])
    assert todo(retry_failed=True) == ["job-error", "new"]
    both = todo(retry_failed=True, refetch_in_progress=True)
    assert both == sorted([*in_progress, "job-error", "new"])


@pytest.mark.parametrize("output", ["parquet", "json"])
def test_rows_to_fetch_again_are_taken_out_of_the_files(
    ray_session: Any, tmp_path: Path, output: Output
) -> None:
    from asyncsearch.ray import unwritten_job_ids

    out = tmp_path / "out"
    error = "InternalServerError: 503 Service Unavailable from GET /v2/extract/..."
    _write_output(
        out,
        output,
        [
            [("a", None, error), ("b", "done", None), ("c", "pending", None)],
            [("d", None, error)],
            # a's final row, written by a retry of an earlier version of asyncsearch; z is not
            # one of the ids asked about.
            [("a", "done", None), ("e", None, error), ("z", None, error)],
        ],
    )
    original = {path.name: path.read_bytes() for path in out.iterdir()}
    ids = ray_session.data.from_items([{"job_id": i} for i in "abcdef"])

    todo = unwritten_job_ids(
        ids, str(out), format=output, retry_failed=True, refetch_in_progress=True
    )

    assert sorted(row["job_id"] for row in todo.take_all()) == ["c", "d", "e", "f"]
    # Each id is at most once in the output now: the rows to fetch again are gone, and so is the
    # stale error row of a; z's row is left alone. A file left empty is deleted, and no
    # temporary file stays behind.
    rows = Counter(
        (r["job_id"], r["state"], r["error"]) for r in _written(ray_session, out, output)
    )
    assert rows == Counter([("a", "done", None), ("b", "done", None), ("z", None, error)])
    assert sorted(path.name for path in out.iterdir()) == [f"0.{output}", f"2.{output}"]
    if output == "json":  # the rows kept are the lines as they were written
        kept = [original["0.json"].splitlines(keepends=True)[1]]
        assert (out / "0.json").read_bytes().splitlines(keepends=True) == kept
    # A run stopped before it wrote them again loses nothing: they are simply not written.
    assert sorted(
        r["job_id"] for r in unwritten_job_ids(ids, str(out), format=output).take_all()
    ) == [
        "c",
        "d",
        "e",
        "f",
    ]


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
    assert todo((out / "0.parquet").as_uri()) == ["d"]
    assert todo(out.as_uri(), retry_failed=True) == ["c", "d"]
    # c's failed row was taken out through the URI's filesystem: c is now simply not written.
    assert pq.read_table(out / "0.parquet").column("job_id").to_pylist() == ["a", "b"]
    assert todo((out / "0.parquet").as_uri()) == ["c", "d"]
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


# ---------------------------------------------------------------------------------------------
# SharedRateLimit: one quota for a whole export
# ---------------------------------------------------------------------------------------------


class RecordingServer:
    """A loopback server answering ``GET /v2/extract/{id}`` with a done job, recording the time
    (this machine's monotonic clock, the same in every process) each request arrives at."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-recorder")
        self.base_url = ""

    def __enter__(self) -> RecordingServer:
        from aiohttp import web

        async def job(request: web.Request) -> web.Response:
            self.arrivals.append(time.monotonic())
            return web.json_response({"id": request.match_info["job"], "state": "done"})

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_get("/v2/extract/{job}", job)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            return runner

        self.thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()

    def most_in_a_second(self) -> int:
        """The most requests that arrived within any window of 1 second."""
        times = sorted(self.arrivals)
        return max((bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times)), default=0)


def _bound(per_second: float, burst: int, copies: int) -> float:
    """The documented most requests in a 1-second window: the bucket's, plus the leases."""
    lease = max(1, int(per_second // 10))
    return per_second + burst + lease * (copies + 1)


def test_shared_quota_holds_across_four_actors_and_a_worker_that_dies(
    ray_session: Any, tmp_path: Path
) -> None:
    """4 actors, each with 16 requests in flight against an instant server (far more than the
    quota), share one SharedRateLimit; one actor's process exits in the middle of a batch. Every
    id comes back exactly once, and no 1-second window holds more than the documented bound."""
    from asyncsearch.ray import FetchExtractions, SharedRateLimit

    marker = tmp_path / "exited"

    class ExitsOnce(FetchExtractions):
        """Exits its process in its second batch, after fetching part of it (once per test)."""

        calls = 0

        async def __call__(self, batch: Any) -> Any:
            self.calls += 1
            if self.calls == 2:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    await super().__call__(batch.slice(0, 3))
                    os._exit(1)  # a worker dying with its lease and requests in flight
            return await super().__call__(batch)

    per_second, burst = 25, 1
    limit = SharedRateLimit(per_second, burst=burst)
    ids = [str(uuid.uuid4()) for _ in range(200)]
    with RecordingServer() as server:
        rows = (
            ray_session.data.from_items([{"job_id": i} for i in ids], override_num_blocks=20)
            .map_batches(
                ExitsOnce,
                fn_constructor_kwargs={
                    "api_key": KEY,
                    "base_url": server.base_url,
                    "concurrency": 16,
                    "rate_limit": limit,
                },
                batch_size=10,
                batch_format="pyarrow",
                compute=ray_session.data.ActorPoolStrategy(size=4),
                num_cpus=0.25,
            )
            .take_all()
        )
    assert marker.exists(), "no worker exited: the test did not test that"
    assert Counter(row["job_id"] for row in rows) == Counter(ids)  # every id exactly once
    assert [row["error"] for row in rows] == [None] * len(ids)
    assert len(server.arrivals) >= len(ids)
    assert server.most_in_a_second() <= _bound(per_second, burst, copies=4)


def test_shared_quota_with_a_deadline_and_bulk_calls_in_ray_tasks(ray_session: Any) -> None:
    """Composed: two Ray tasks, each one client under the same SharedRateLimit, each a
    gather_extractions of 40 ids (all in flight at once) whose calls have a 1.5 s deadline.
    What the quota cannot let out in time fails unsent; nothing else is lost or sent twice."""
    from asyncsearch.ray import SharedRateLimit

    # A busy machine (CI's time scale) gets a longer deadline, and as many more ids: some are
    # still fetched in time and some still cannot be, whatever the machine's speed.
    per_second, burst, deadline = 10, 2, 1.5 * TIME_SCALE
    n = 40 * math.ceil(TIME_SCALE)
    limit = SharedRateLimit(per_second, burst=burst)

    @ray_session.remote(num_cpus=0.25)
    def export(ids: list[str], base_url: str, limit: Any) -> tuple[float, float, list[Any]]:
        from asyncsearch import APITimeoutError

        async def run() -> tuple[float, float, list[Any]]:
            started = time.monotonic()
            client = AsyncSearchClient(KEY, base_url=base_url, rate_limit=limit)
            async with client:
                results = await client.gather_extractions(
                    ids, concurrency=len(ids), deadline=deadline
                )
            rows = []
            for result in results:
                error = result.error
                timed_out = error is None or isinstance(error, APITimeoutError)
                sent = error is None or error.request_sent
                rows.append((result.job_id, error is None, timed_out, sent))
            return started, time.monotonic() - started, rows

        return asyncio.run(run())

    batches = [[str(uuid.uuid4()) for _ in range(n)] for _ in range(2)]
    with RecordingServer() as server:
        answers = ray_session.get(
            [export.remote(ids, server.base_url, limit) for ids in batches], timeout=120
        )
    rows = [row for _, _, batch in answers for row in batch]
    # The quota's wait ends at the deadline: no call waited on for its token past it.
    assert max(took for _, took, _ in answers) < deadline + 1.0 * TIME_SCALE
    assert [row[0] for row in rows] == [i for ids in batches for i in ids]  # each id, once
    fetched = sum(ok for _, ok, _, _ in rows)
    assert all(timed_out for _, _, timed_out, _ in rows)  # a failure is the deadline's
    # The server saw the fetched ids and at most those the deadline cut after they were sent:
    # the calls whose token would come too late sent nothing.
    assert fetched <= len(server.arrivals) <= sum(sent for _, _, _, sent in rows)
    assert 0 < fetched < len(rows)  # the quota let some out in time, not all
    assert server.most_in_a_second() <= _bound(per_second, burst, copies=2)
    # No request went out after its call's deadline (plus loopback delivery, however slow).
    latest = max(started for started, _, _ in answers) + deadline
    assert max(server.arrivals) <= latest + 1.0 * TIME_SCALE


def test_shared_quota_copies_share_one_actor_each_with_a_view_of_its_own(
    ray_session: Any,
) -> None:
    import pickle

    from asyncsearch import RateLimit
    from asyncsearch.ray import SharedRateLimit

    limit = SharedRateLimit(100, burst=3)
    limit.LEASE_SECONDS = 60  # no lease expires during the test, however slow the machine
    copy = pickle.loads(pickle.dumps(limit))
    assert isinstance(copy, RateLimit)
    assert repr(copy) == repr(limit) == "SharedRateLimit(per_second=100, burst=3)"
    assert (copy.lease, copy.timeout) == (limit.lease, limit.timeout) == (10, 10.0)

    async def run() -> None:
        await limit.take()  # a first lease of 1 token, spent
        await limit.take()  # the next is twice that: 1 token left in this copy's lease
        assert (limit.tokens, limit.waiting) == (1.0, 0)
        assert (copy.tokens, copy.waiting) == (0.0, 0)  # nothing leased by the copy yet
        assert limit.wait() == 0.0
        await copy.take()  # from the same quota actor
        assert copy.tokens == 0.0

    asyncio.run(run())
    # Two instances are two quotas: each has an actor of its own.
    assert pickle.dumps(SharedRateLimit(100, burst=3)) != pickle.dumps(limit)


def test_shared_quota_wait_is_a_lower_bound_of_the_real_wait(ray_session: Any) -> None:
    """``wait()`` never says more than a request then waits, and says more than 0 once this
    process's own queue needs more than the quota can give at once."""
    from asyncsearch.ray import SharedRateLimit

    limit = SharedRateLimit(5)  # a lease of 1 token; a token every 0.2 s

    async def one() -> tuple[float, float]:
        said = limit.wait()
        started = time.monotonic()
        await limit.take()
        return said, time.monotonic() - started

    async def run() -> list[tuple[float, float]]:
        return list(await asyncio.gather(*(one() for _ in range(8))))

    waits = asyncio.run(run())
    assert all(said <= waited + 0.02 for said, waited in waits), waits
    assert max(said for said, _ in waits) >= 7 / 5 - 0.01  # the 8th: 7 tokens after the first


def test_shared_quota_gives_back_unsent_tokens_and_returns_a_lease_on_release(
    ray_session: Any,
) -> None:
    from asyncsearch.ray import SharedRateLimit

    limit = SharedRateLimit(0.01)  # no refill to speak of during the test
    limit.LEASE_SECONDS = 60  # nor an expired lease, however slow the machine
    quota = limit._actor
    ray_session.get(quota.give_back.remote(1), timeout=60)  # one token in the bucket

    async def run() -> None:
        await limit.take()
        assert ray_session.get(quota.level.remote(), timeout=60) < 0.1  # leased
        limit.give_back()  # its request was not sent: back into this process's lease
        assert limit.tokens == 1.0
        await limit.release()  # what the client's aclose does: the unused token goes back
        assert limit.tokens == 0.0

    asyncio.run(run())
    assert ray_session.get(quota.level.remote(), timeout=60) >= 0.99


def test_a_shared_quota_lease_expires(ray_session: Any) -> None:
    """Tokens of a lease past ``LEASE_SECONDS`` are not spent, nor given back into."""
    from asyncsearch.ray import SharedRateLimit

    limit = SharedRateLimit(100)
    limit.LEASE_SECONDS = 0.2

    async def run() -> None:
        await limit.take()
        await limit.take()  # a lease of 2: one token left, until 0.2 s after it was asked for
        await asyncio.sleep(0.25)  # this process's own clock passing, nothing else awaited
        assert limit.tokens == 0.0
        limit.give_back()
        assert limit.tokens == 0.0
        assert limit.wait() == 0.0  # nothing known of the quota's debt: the least is none

    asyncio.run(run())


def test_shared_quota_restarted_starts_empty(ray_session: Any) -> None:
    from asyncsearch.ray import SharedRateLimit

    limit = SharedRateLimit(0.1, burst=5)
    quota = limit._actor
    assert ray_session.get(quota.level.remote(), timeout=60) < 1  # the first start is empty too
    ray_session.get(quota.give_back.remote(5), timeout=60)
    assert ray_session.get(quota.level.remote(), timeout=60) == 5
    # Its process dies (killed for sure before the next call is sent); Ray starts it again.
    pid = ray_session.get(quota.__ray_call__.remote(lambda _: os.getpid()), timeout=60)
    os.kill(pid, signal.SIGKILL)
    # The call goes to the restarted actor: a full bucket would let old leases pass the bound.
    assert ray_session.get(quota.level.remote(), timeout=60) < 1


def test_an_unreachable_quota_fails_the_waiting_requests_in_time_never_a_hang(
    ray_session: Any,
) -> None:
    from asyncsearch.ray import QuotaUnavailableError, SharedRateLimit

    @ray_session.remote(num_cpus=0)
    class Silent:
        def lease(self, tokens: int) -> Any:
            time.sleep(120)  # never answers in time

    limit = SharedRateLimit(100)
    limit.timeout = 1.0
    silent = Silent.remote()  # type: ignore[attr-defined]
    limit._actor = silent

    async def run() -> tuple[list[BaseException], float]:
        started = time.monotonic()
        results = await asyncio.gather(*(limit.take() for _ in range(10)), return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)], time.monotonic() - started

    try:
        with RecordingServer() as server:
            errors, elapsed = asyncio.run(run())
            assert len(errors) == 10
            assert all(isinstance(e, QuotaUnavailableError) for e in errors), errors
            assert "did not answer within 1s; the request was not sent" in str(errors[0])
            # Every request waiting for that lease failed with it: not ten timeouts in a row,
            # which would take 10 s however fast the machine (and this one, however slow).
            assert 1.0 <= elapsed < 10.0

            async def call() -> None:
                async with AsyncSearchClient(
                    KEY, base_url=server.base_url, rate_limit=limit
                ) as client:
                    await client.get_extraction(str(uuid.uuid4()))

            with pytest.raises(QuotaUnavailableError) as info:
                asyncio.run(call())
            assert info.value.attempts == 0
            assert server.arrivals == []
    finally:
        ray_session.kill(silent)

    # A quota actor that is gone for good fails the request at once.
    gone = SharedRateLimit(100)
    ray_session.kill(gone._actor, no_restart=True)
    with pytest.raises(QuotaUnavailableError, match="cannot be reached"):
        asyncio.run(gone.take())


def test_read_search_under_a_shared_quota(
    ray_session: Any, emu: ThreadedEmulator, base_id: str
) -> None:
    from asyncsearch.ray import QuotaUnavailableError, SharedRateLimit, read_search

    emu.do(emu.emu.seed, n_resources=30, n_jobs=0, seed=5, base_id=base_id)
    search = {"api_key": KEY, "base_url": emu.emu.base_url, "base_id": base_id, "page_size": 10}
    limit = SharedRateLimit(50)
    assert read_search(rate_limit=limit, **search).count() == 30
    # The read task's client takes its tokens from the quota: with the quota gone, the read
    # fails, and the error reaches the driver typed.
    ray_session.kill(limit._actor, no_restart=True)
    with pytest.raises(QuotaUnavailableError, match="cannot be reached"):
        read_search(rate_limit=limit, **search).take_all()
