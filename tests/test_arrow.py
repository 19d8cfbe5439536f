"""asyncsearch.arrow: search walks and bulk results as Arrow tables, over loopback servers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

pytest.importorskip(
    "pyarrow", reason="asyncsearch.arrow needs pyarrow (the arrow extra, in the test extra)"
)

import numpy as np
import pyarrow as pa
import pytest_asyncio
from aiohttp import web

import asyncsearch
import asyncsearch.arrow
from asyncsearch import (
    AsyncSearchClient,
    InvalidRequestError,
    ResponseValidationError,
    SearchPage,
)
from asyncsearch.arrow import (
    EMBEDDING_NAMES,
    EXTRACTION_SCHEMA,
    HIT_COLUMNS,
    MAX_HELD_HITS,
    HitBatches,
    extractions_table,
    search_table,
)
from asyncsearch.testing import ServiceEmulator

from .conftest import Handler, Server
from .helpers import TIME_SCALE

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(60)

KEY = "arrow-key"


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=5, n_resources=70, n_jobs=12) as emu:
        yield emu


def client_of(base_url: str, **options: Any) -> AsyncSearchClient:
    return AsyncSearchClient(KEY, base_url=base_url, **options)


async def test_a_search_table_holds_every_hit_with_the_sdks_own_values(
    emulator: ServiceEmulator,
) -> None:
    async with client_of(emulator.base_url) as client:
        table = await search_table(client, filters={}, page_size=20)
        pages: list[SearchPage] = [p async for p in client.search_pages(filters={}, page_size=20)]
    hits = [hit for page in pages for hit in page.hits]
    assert len(pages) >= 3
    assert table.num_rows == len(hits) == 70
    assert table.schema.names == [name for name, _ in HIT_COLUMNS] + list(EMBEDDING_NAMES)
    for name, kind in HIT_COLUMNS:
        assert table.schema.field(name).type == kind
        assert table.column(name).to_pylist() == [getattr(hit, name) for hit in hits], name
    for name in EMBEDDING_NAMES:
        column = table.column(name).combine_chunks()
        width = pages[0].embedding_matrix(name).shape[1]
        assert column.type == pa.list_(pa.float32(), width)
        assert column.null_count == 0
        matrix = column.values.to_numpy().reshape(len(hits), width)
        expected = np.concatenate([page.embedding_matrix(name) for page in pages])
        np.testing.assert_array_equal(matrix, expected)


def _hit(hit_id: str, **embeddings: list[float]) -> dict[str, Any]:
    hit: dict[str, Any] = {"id": hit_id, "name": f"resource {hit_id}", "score": 0.5}
    if embeddings:
        hit["embeddings"] = embeddings
    return hit


def canned(pages: list[list[dict[str, Any]]]) -> Handler:
    async def search(request: web.Request) -> web.StreamResponse:
        number = int(((await request.json()).get("pagination") or {}).get("page", 1))
        hits = pages[number - 1] if 1 <= number <= len(pages) else []
        total = sum(len(page) for page in pages)
        return web.json_response({"total": total, "hasMore": number < len(pages), "hits": hits})

    return search


SMALL = {n: [float(n), n + 0.5, -float(n)] for n in range(5)}  # 3 values: no width is assumed
CLIP = {n: [n / 4, 1.0, 2.0, 3.0, -n / 4] for n in range(5)}
PAGES = [
    # No hit of the first page has a clip2 vector: its width is known from page 2 on.
    [_hit("a", small3_512=SMALL[0]), _hit("b", small3_512=SMALL[1])],
    [_hit("c", small3_512=SMALL[2], clip2=CLIP[2]), _hit("d")],
    [_hit("e", small3_512=SMALL[4], clip2=CLIP[4])],
]


async def test_a_missing_vector_is_null_and_the_width_follows_the_data(serve: Serve) -> None:
    server = await serve(canned(PAGES))
    async with client_of(server.base_url) as client:
        table = await search_table(client, "q")
    assert table.column("id").to_pylist() == list("abcde")
    assert table.schema.field("small3_512").type == pa.list_(pa.float32(), 3)
    assert table.schema.field("clip2").type == pa.list_(pa.float32(), 5)
    small = table.column("small3_512").to_pylist()
    clip = table.column("clip2").to_pylist()
    assert [v is None for v in small] == [False, False, False, True, False]
    assert [v is None for v in clip] == [True, True, False, True, False]
    # The values as the SDK's float32 matrices hold them.
    assert small[2] == [float(np.float32(x)) for x in SMALL[2]]
    assert clip[4] == [float(np.float32(x)) for x in CLIP[4]]


async def test_a_vector_of_another_width_is_a_typed_error(serve: Serve) -> None:
    server = await serve(canned([[_hit("a", clip2=[1.0] * 5)], [_hit("b", clip2=[1.0] * 4)]]))
    async with client_of(server.base_url) as client:
        with pytest.raises(ResponseValidationError) as info:
            await search_table(client, "q")
        with pytest.raises(ResponseValidationError, match=r"\(as embedding_widths gives\)"):
            await search_table(client, "q", embedding_widths={"clip2": 5, "small3_512": 1})
    assert info.value.path == "$.hits[*].embeddings.clip2"
    assert "hit 'b' has 4 clip2 values, where this walk's clip2 column has 5" in str(info.value)


async def test_a_column_no_hit_has_is_all_null_of_width_zero_or_as_given(serve: Serve) -> None:
    server = await serve(canned([[_hit("a", small3_512=[1.0, 2.0]), _hit("b")]]))
    async with client_of(server.base_url) as client:
        table = await search_table(client, "q")
        given = await search_table(client, "q", embedding_widths={"clip2": 768})
    assert table.schema.field("clip2").type == pa.list_(pa.float32(), 0)
    assert table.column("clip2").null_count == 2
    assert given.schema.field("clip2").type == pa.list_(pa.float32(), 768)
    assert given.column("clip2").null_count == 2


async def test_max_items_and_lean_pages(emulator: ServiceEmulator) -> None:
    def searches() -> int:
        return sum(1 for r in emulator.requests if r.endpoint == "search")

    async with client_of(emulator.base_url) as client:
        cut = await search_table(client, filters={}, page_size=20, max_items=25)
        # 25 hits of pages of 20: two requests, no third sent ahead.
        assert searches() == 2
        lean = await search_table(client, filters={}, page_size=30, embeddings=False)
        assert searches() == 2 + 3
        none = await search_table(client, filters={}, max_items=0)
        assert searches() == 2 + 3
        hits = [h async for h in client.search_hits(filters={}, page_size=20, max_items=25)]
    assert cut.column("id").to_pylist() == [hit.id for hit in hits]
    assert lean.num_rows == 70
    assert lean.schema.names == [name for name, _ in HIT_COLUMNS]
    assert none.num_rows == 0
    assert none.schema.names == cut.schema.names


async def test_bad_arguments_are_refused_before_anything_is_sent(emulator: ServiceEmulator) -> None:
    async with client_of(emulator.base_url) as client:
        for bad in ({"max_items": -1}, {"max_items": 1.5}, {"embedding_widths": {"clip3": 4}}):
            with pytest.raises(InvalidRequestError):
                await search_table(client, "q", **bad)
        with pytest.raises(InvalidRequestError):
            await search_table(client, "x" * 300)
        with pytest.raises(InvalidRequestError):
            await extractions_table(client, "not-a-list-of-ids")  # type: ignore[arg-type]
    assert emulator.requests == []


async def test_an_extractions_table_has_every_id_once_in_input_order(
    emulator: ServiceEmulator,
) -> None:
    jobs = emulator.jobs()
    missing = "00000000-0000-4000-8000-000000000000"
    ids = [jobs[3]["id"], missing, jobs[0]["id"], "not an id", jobs[3]["id"]]
    async with client_of(emulator.base_url) as client:
        table = await extractions_table(client, ids, concurrency=3)
        expected = [await client.get_extraction(jobs[i]["id"]) for i in (3, 0)]
    assert table.schema == EXTRACTION_SCHEMA
    assert table.column("job_id").to_pylist() == ids
    states = table.column("state").to_pylist()
    errors = table.column("error").to_pylist()
    extractions = table.column("extraction").to_pylist()
    assert states == [expected[0].state, None, expected[1].state, None, expected[0].state]
    assert [e is None for e in errors] == [True, False, True, False, True]
    assert errors[1].startswith("NotFoundError: ")
    assert errors[3].startswith("InvalidRequestError: ")
    for text, job in ((extractions[0], expected[0]), (extractions[2], expected[1])):
        wire = None if job.extraction is None else json.loads(msgspec.json.encode(job.extraction))
        assert (None if text is None else json.loads(text)) == wire


def _page(*hits: dict[str, Any]) -> SearchPage:
    body = {"total": len(hits), "hasMore": True, "hits": list(hits)}
    return msgspec.json.decode(json.dumps(body), type=SearchPage)


def _widths(batch: pa.RecordBatch) -> dict[str, int]:
    return {name: batch.schema.field(name).type.list_size for name in EMBEDDING_NAMES}


def test_hit_batches_hold_pages_back_until_every_width_is_known_and_no_longer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batches = HitBatches(max_held_hits=3)
    # No clip2 vector yet: the pages wait, in order.
    assert batches.add(_page(_hit("a", small3_512=[1.0, 2.0]))) == []
    assert batches.add(_page(_hit("b", small3_512=[3.0, 4.0]))) == []
    # The third hit held reaches the limit: clip2, which no hit had, gets width 0.
    released = batches.add(_page(_hit("c")))
    assert [batch.column("id").to_pylist() for batch in released] == [["a"], ["b"], ["c"]]
    assert [_widths(batch) for batch in released] == [{"small3_512": 2, "clip2": 0}] * 3
    assert released[2].column("small3_512").to_pylist() == [None]
    # A clip2 vector after that is valid data the column cannot hold: left out (null), counted,
    # and logged once with what keeps it. Never an error.
    with caplog.at_level(logging.WARNING, logger="asyncsearch.arrow"):
        (late,) = batches.add(_page(_hit("d", clip2=[1.0, 2.0, 3.0]), _hit("e", clip2=[1.0] * 3)))
        (later,) = batches.add(_page(_hit("f", small3_512=[5.0, 6.0], clip2=[1.0] * 3)))
    assert _widths(late) == _widths(later) == {"small3_512": 2, "clip2": 0}
    assert late.column("clip2").to_pylist() == [None, None]
    assert later.column("small3_512").to_pylist() == [[5.0, 6.0]]
    assert batches.left_out == {"clip2": 3}
    assert [record.getMessage() for record in caplog.records] == [
        "clip2 vectors came after the clip2 column was settled as absent (no hit among the"
        " first 3 had one, so it got 0); they are left out (null). Pass"
        " embedding_widths={'clip2': 3} to keep them"
    ]

    # A walk with no clip2 vector at all, shorter than the limit: its end lets the pages go.
    batches = HitBatches(max_held_hits=100)
    assert batches.add(_page(_hit("a", small3_512=[1.0]), _hit("b"))) == []
    (batch,) = batches.finish()
    assert _widths(batch) == {"small3_512": 1, "clip2": 0}
    assert batch.column("clip2").to_pylist() == [None, None]


#: A walk whose clip2 vectors start late: 100 hits a page, every hit with a small3_512 vector,
#: and a clip2 vector from hit LATE_CLIP2 on, past the look-ahead of MAX_HELD_HITS hits.
LATE_PAGE_SIZE = 100
LATE_HITS = MAX_HELD_HITS + 2_000
LATE_CLIP2 = MAX_HELD_HITS + 50


def late_vector_pages() -> list[list[dict[str, Any]]]:
    """The pages of that walk, in the wire form."""
    hits = []
    for n in range(LATE_HITS):
        vectors = {"small3_512": [float(n), 0.5, -1.0]}
        if n >= LATE_CLIP2:
            vectors["clip2"] = [1.0, 2.0, 3.0, float(n)]
        hits.append(_hit(f"h{n}", **vectors))
    return [hits[i : i + LATE_PAGE_SIZE] for i in range(0, LATE_HITS, LATE_PAGE_SIZE)]


def check_late_vector_result(ids: list[str], small: Any, clip2: Any) -> None:
    """The documented result of that walk, on any path: every hit in order, small3_512 as wide
    as its vectors, and clip2, with no vector among the first MAX_HELD_HITS hits, settled as
    absent (width 0), its later vectors left out. ``small`` and ``clip2``: (rows, width)."""
    assert ids == [f"h{n}" for n in range(LATE_HITS)]
    assert small.shape == (LATE_HITS, 3)
    np.testing.assert_array_equal(small[:, 0], np.arange(LATE_HITS, dtype=np.float32))
    assert clip2.shape == (LATE_HITS, 0)


def matrix_of(table: pa.Table, name: str) -> Any:
    """A ``fixed_size_list<float32>`` column as a (rows, width) matrix."""
    column = table.column(name).combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), column.type.list_size)


class CountingHitBatches(HitBatches):
    """``HitBatches`` that records how many pages it holds back after each page."""

    made: ClassVar[list[CountingHitBatches]] = []

    def __post_init__(self) -> None:
        super().__post_init__()
        self.held_after_each_page: list[int] = []
        CountingHitBatches.made.append(self)

    def add(self, page: Any, hits: int | None = None) -> list[pa.RecordBatch]:
        batches = super().add(page, hits)
        self.held_after_each_page.append(len(self._held))
        return batches


async def test_a_late_vector_column_is_settled_after_a_bounded_look_ahead(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The rule of HitBatches, as search_table follows it: pages are held back while clip2's
    # width is unknown, never more than MAX_HELD_HITS hits (the table used to hold every page of
    # a walk without clip2 until its end); then clip2 is settled as absent and its later
    # vectors are left out, where a file written as it goes used to fail at hit 10,000.
    CountingHitBatches.made.clear()
    monkeypatch.setattr(asyncsearch.arrow, "HitBatches", CountingHitBatches)
    server = await serve(canned(late_vector_pages()))
    async with client_of(server.base_url) as client:
        with caplog.at_level(logging.WARNING, logger="asyncsearch.arrow"):
            table = await search_table(client, "q")

    (builder,) = CountingHitBatches.made
    pages = -(-LATE_HITS // LATE_PAGE_SIZE)
    assert len(builder.held_after_each_page) == pages
    # Held pages grow to the look-ahead, are let go at its end, and nothing is held after.
    look_ahead = MAX_HELD_HITS // LATE_PAGE_SIZE
    assert max(builder.held_after_each_page) == look_ahead - 1
    assert builder.held_after_each_page[look_ahead - 1 :] == [0] * (pages - look_ahead + 1)
    assert builder.left_out == {"clip2": LATE_HITS - LATE_CLIP2}
    assert len(caplog.records) == 1
    assert "embedding_widths={'clip2': 4}" in caplog.records[0].getMessage()

    assert table.schema.field("clip2").type == pa.list_(pa.float32(), 0)
    assert table.column("clip2").null_count == LATE_HITS
    check_late_vector_result(
        table.column("id").to_pylist(), matrix_of(table, "small3_512"), matrix_of(table, "clip2")
    )

    # embedding_widths keeps the late vectors: nothing is held back or left out.
    async with client_of(server.base_url) as client:
        kept = await search_table(client, "q", embedding_widths={"clip2": 4})
    assert max(CountingHitBatches.made[1].held_after_each_page) == 0
    assert kept.column("clip2").null_count == LATE_CLIP2
    assert kept.column("clip2")[LATE_CLIP2].as_py() == [1.0, 2.0, 3.0, float(LATE_CLIP2)]


def test_hit_batches_take_the_widths_given() -> None:
    batches = HitBatches({"small3_512": 2, "clip2": 3}, max_held_hits=100)
    # Both widths known: nothing is held back, and a hit without vectors has nulls.
    (batch,) = batches.add(_page(_hit("a")))
    assert _widths(batch) == {"small3_512": 2, "clip2": 3}
    assert batch.column("clip2").to_pylist() == [None]
    with pytest.raises(ResponseValidationError) as info:
        batches.add(_page(_hit("b", clip2=[1.0] * 4)))
    assert str(info.value) == (
        "hit 'b' has 4 clip2 values, where this walk's clip2 column has 3"
        " (as embedding_widths gives)"
    )


def test_import_asyncsearch_imports_no_pyarrow() -> None:
    code = "import sys, asyncsearch; print('pyarrow' in sys.modules, 'numpy' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
        check=True,
    )
    assert done.stdout.split() == ["False", "False"]


def test_vector_columns_as_matrices_have_nan_rows_for_missing_vectors() -> None:
    """What asyncsearch.ray's tensor columns hold (tests/test_ray.py needs Ray; this does not):
    a hit without the vector is a row of NaN, as SearchPage.embedding_matrix gives it."""
    from asyncsearch.arrow import vector_matrix

    width = 3
    values = [[1.0, 2.0, 3.0], None, [4.0, 5.0, 6.0], None]
    column = pa.array(values, type=pa.list_(pa.float32(), width))
    matrix = vector_matrix(column)
    assert matrix.dtype == np.float32
    assert matrix.shape == (4, width)
    np.testing.assert_array_equal(matrix[[0, 2]], [[1, 2, 3], [4, 5, 6]])
    assert np.isnan(matrix[[1, 3]]).all()
    # Without a null the column's values are taken as they are.
    whole = vector_matrix(pa.array(values[::2], type=pa.list_(pa.float32(), width)))
    np.testing.assert_array_equal(whole, [[1, 2, 3], [4, 5, 6]])
    # A column settled as absent (width 0, all null) is a matrix of no columns.
    assert vector_matrix(pa.array([None, None], type=pa.list_(pa.float32(), 0))).shape == (2, 0)


def test_the_ray_module_makes_its_tensor_columns_with_vector_matrix() -> None:
    """The function tested above is the one asyncsearch.ray uses (read without importing Ray)."""
    source = Path(asyncsearch.__file__).with_name("ray.py").read_text()
    assert "ArrowTensorArray.from_numpy(vector_matrix(column)" in source
