"""Search walks and bulk extraction results as Arrow tables (``pip install -e '.[arrow]'``).

``import asyncsearch`` never imports this module (nor pyarrow): import ``asyncsearch.arrow``.

- ``await search_table(client, "q", ...)``: one row per hit, in the service's order: the hit's
  scalar fields (``HIT_COLUMNS``) and its embeddings as ``fixed_size_list<float32>`` columns
  ``small3_512`` and ``clip2`` (null for a hit without one). Built page by page into record
  batches: the vectors go from each page's ``embedding_matrix`` into Arrow buffers, never
  through a Python object per float.
- ``await extractions_table(client, job_ids, ...)``: one row per id, in input order:
  ``job_id``, ``state``, ``extraction`` (JSON text) and ``error`` (null on success).
- ``HitBatches`` and ``extractions_batch``: the same columns for code that writes as it goes
  (``asyncsearch.ray``, the CLI's ``--parquet``), so the schema is defined once, here.

The spec shows no embedding widths, nor whether every hit carries its vectors. One rule, in
``HitBatches`` (so the same for a table, a Ray dataset and the CLI's ``--parquet``): a column is
as wide as the first vector of its name (or as ``embedding_widths`` says), and a vector of
another width is a ``ResponseValidationError``. While a width is unknown, pages are held back,
at most ``MAX_HELD_HITS`` (10,000) hits; a column with no vector among them (or in the whole
walk, if shorter) is settled as absent: ``fixed_size_list<float32>[0]``, all null. A vector of
that name coming later is left out (null), never an error: counted in ``HitBatches.left_out``
and logged once as a WARNING on the ``asyncsearch.arrow`` logger, which names the
``embedding_widths`` that keeps such vectors.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, Unpack, get_args

import msgspec

from asyncsearch import (
    AsyncSearchClient,
    ExtractionFormat,
    ExtractionJob,
    ExtractionResult,
    InvalidRequestError,
    LeanSearchPage,
    RequestOptions,
    ResponseValidationError,
    SearchPage,
)
from asyncsearch._errors import install_hint
from asyncsearch._models import embedding_matrices


@contextlib.contextmanager
def needs_extra(needs: str, extra: str) -> Iterator[None]:
    """Turn a failed import into an ImportError saying what ``needs`` it and how to install
    the ``extra`` that brings it (for ``asyncsearch.arrow`` and ``asyncsearch.ray``)."""
    try:
        yield
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise ImportError(f"{needs}: {install_hint(extra)} ({exc.name or exc} is missing)") from exc


with needs_extra("asyncsearch.arrow needs pyarrow and numpy", "arrow"):
    import numpy as np
    import pyarrow as pa

if TYPE_CHECKING:
    # For the signature only: the keywords of search_pages, declared once in the client.
    from asyncsearch._client import SearchWalkCallParams

__all__ = [
    "EMBEDDING_NAMES",
    "EXTRACTION_SCHEMA",
    "HIT_COLUMNS",
    "MAX_HELD_HITS",
    "EmbeddingName",
    "HitBatches",
    "extractions_batch",
    "extractions_table",
    "hit_schema",
    "search_table",
]

#: The names of a hit's embeddings, in the order of their columns.
EmbeddingName = Literal["small3_512", "clip2"]
EMBEDDING_NAMES: tuple[EmbeddingName, ...] = get_args(EmbeddingName)

#: The scalar columns of a hit: (column, its Arrow type). Column names are the model's
#: attribute names; timestamps whose format the spec does not document stay text.
HIT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("id", pa.string()),
    ("name", pa.string()),
    ("kind", pa.string()),
    ("score", pa.float64()),
    ("created_at", pa.string()),
    ("modified_at", pa.string()),
    ("mime_type", pa.string()),
    ("extension", pa.string()),
    ("description", pa.string()),
    ("size", pa.float64()),
    ("url", pa.string()),
    ("origin_url", pa.string()),
    ("file_url", pa.string()),
    ("state_processing", pa.string()),
    ("is_password_protected", pa.bool_()),
    ("is_locked", pa.bool_()),
)

_SCALARS = attrgetter(*(name for name, _ in HIT_COLUMNS))

#: The columns of an extraction result: one row per id.
EXTRACTION_SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string()),
        pa.field("state", pa.string()),
        pa.field("extraction", pa.string()),
        pa.field("error", pa.string()),
    ]
)

#: The most hits ``HitBatches`` holds back while a width is unknown: the look-ahead after which
#: a column with no vector is settled as absent (width 0).
MAX_HELD_HITS = 10_000

logger = logging.getLogger("asyncsearch.arrow")


def hit_schema(widths: Mapping[EmbeddingName, int] | None) -> pa.Schema:
    """The schema of a table of hits; ``None``: without embedding columns (lean pages).

    Args:
        widths: The width of each embedding column; ``None``: no embedding columns.

    Returns:
        The schema: ``HIT_COLUMNS``, then the embedding columns.
    """
    fields = [pa.field(name, kind) for name, kind in HIT_COLUMNS]
    if widths is not None:
        fields += [pa.field(n, pa.list_(pa.float32(), widths[n])) for n in EMBEDDING_NAMES]
    return pa.schema(fields)


@dataclass
class _HeldPage:
    """A page made into columns, kept until every embedding's width is known."""

    #: Per hit, its scalar fields (``HIT_COLUMNS``), made into columns when the batch is.
    scalars: list[tuple[Any, ...]]
    #: Per embedding: the page's float32 matrix and which rows have a vector; None: no row has.
    vectors: dict[EmbeddingName, tuple[Any, Any] | None]
    rows: int


@dataclass
class HitBatches:
    """Pages of hits as record batches of one schema, for a table or a file written as it goes.

    The one place of the rule for widths, used by ``search_table``, ``asyncsearch.ray`` and the
    CLI's ``--parquet``. ``add(page)`` returns the batches ready so far, in page order;
    ``finish()`` the rest. A column's width is that of the first vector of its name, or the one
    ``widths`` gives; a vector of another width is a ``ResponseValidationError``. Until every
    width is known, pages are held back (as numpy columns, not as pages), at most
    ``max_held_hits`` hits: once that many are held, and at the end, a column no hit had is
    settled as absent (width 0, all null). A vector of a settled column that comes later is left
    out (null), counted in ``left_out`` and logged once per column as a WARNING, never an
    error: valid data never fails, and memory stays bounded. With ``embeddings=False`` (lean
    pages) there are no embedding columns and nothing is held.

    Args:
        widths: Widths known in advance, per embedding name.
        max_held_hits: The most hits held back while a width is unknown.
        embeddings: ``False``: lean pages, no embedding columns.
        origins: Where each known width came from, for the error when a vector disagrees with it.
        settled: The columns that got width 0 because no hit had them (and not from ``widths``).
        left_out: Per settled column, how many vectors came after it was settled and were left
            out.
        held_hits: The hits held back now.
        walked_hits: The hits taken so far.
    """

    widths: dict[EmbeddingName, int | None] = field(default_factory=dict)
    max_held_hits: int = MAX_HELD_HITS
    embeddings: bool = True
    #: Where each known width came from, for the error when a vector disagrees with it.
    origins: dict[EmbeddingName, str] = field(default_factory=dict)
    #: The columns that got width 0 because no hit had them (and not from ``widths``).
    settled: set[EmbeddingName] = field(default_factory=set)
    #: Per settled column, how many vectors came after it was settled and were left out.
    left_out: dict[EmbeddingName, int] = field(default_factory=dict)
    _held: list[_HeldPage] = field(default_factory=list, init=False, repr=False)
    held_hits: int = 0
    walked_hits: int = 0

    def __post_init__(self) -> None:
        given = check_embedding_widths(self.widths)
        self.widths = {name: given.get(name) for name in EMBEDDING_NAMES}
        self.origins = dict.fromkeys(given, "as embedding_widths gives")

    @property
    def schema(self) -> pa.Schema | None:
        """The batches' schema, once every width is known (always, without embeddings)."""
        if not self.embeddings:
            return hit_schema(None)
        widths = {name: width for name, width in self.widths.items() if width is not None}
        return hit_schema(widths) if len(widths) == len(EMBEDDING_NAMES) else None

    def add(
        self, page: SearchPage | LeanSearchPage, hits: int | None = None
    ) -> list[pa.RecordBatch]:
        """The batches ready once ``page`` (its first ``hits`` hits) is taken, in order.

        Args:
            page: The next page of the walk.
            hits: How many of its hits to take; ``None``: all.

        Returns:
            The batches ready, in page order (none while a width is unknown).

        Raises:
            ResponseValidationError: A vector whose width is not its column's.
        """
        chosen = page.hits if hits is None else page.hits[:hits]
        if not chosen:
            return []
        # One call per hit for every scalar field; the columns are made with the batch.
        scalars = list(map(_SCALARS, chosen))
        vectors: dict[EmbeddingName, tuple[Any, Any] | None] = {}
        if self.embeddings:
            matrices = embedding_matrices(chosen, EMBEDDING_NAMES)
            for name in EMBEDDING_NAMES:
                vectors[name] = self._matrix(chosen, name, matrices[name])
        self._held.append(_HeldPage(scalars, vectors, len(chosen)))
        self.held_hits += len(chosen)
        self.walked_hits += len(chosen)
        if self.held_hits >= self.max_held_hits:
            self._settle(f"no hit among the first {self.walked_hits} had one")
        return self._release()

    def finish(self) -> list[pa.RecordBatch]:
        """The batches still held back once the walk has ended."""
        self._settle("no hit of the search had one")
        return self._release()

    def _matrix(self, hits: list[Any], name: EmbeddingName, made: tuple[Any, Any]) -> Any:
        """The hits' ``name`` vectors as ``SearchPage.embedding_matrix`` makes them (float32,
        NaN rows where a hit has none), and which rows have one; None when no hit has one."""
        path = f"$.hits[*].embeddings.{name}"
        matrix, present = made
        if not present.any():  # no hit of the page has this embedding
            return None
        width = matrix.shape[1]
        first = hits[int(present.argmax())].id
        expected = self.widths[name]
        if expected is None:
            self.widths[name] = width
            self.origins[name] = f"the width of hit {first!r}, the first with one"
        elif name in self.settled:
            return self._leave_out(name, sum(present), width)
        elif width != expected:
            raise ResponseValidationError(
                f"hit {first!r} has {width} {name} values, where this walk's {name} column"
                f" has {expected} ({self.origins[name]})",
                path=path,
                body=b"",
            )
        return matrix, present

    def _leave_out(self, name: EmbeddingName, vectors: int, width: int) -> None:
        """Vectors of a column settled as absent: left out (null), counted, logged once."""
        if name not in self.left_out:
            logger.warning(
                "%s vectors came after the %s column was settled as absent (%s); they are"
                " left out (null). Pass embedding_widths={%r: %d} to keep them",
                name,
                name,
                self.origins[name],
                name,
                width,
            )
        self.left_out[name] = self.left_out.get(name, 0) + vectors

    def _settle(self, reason: str) -> None:
        for name in EMBEDDING_NAMES:
            if self.widths[name] is None:
                self.widths[name] = 0
                self.origins[name] = f"{reason}, so it got 0"
                self.settled.add(name)

    def _release(self) -> list[pa.RecordBatch]:
        schema = self.schema
        if schema is None:
            return []
        batches = [self._batch(page, schema) for page in self._held]
        self._held.clear()
        self.held_hits = 0
        return batches

    def _batch(self, page: _HeldPage, schema: pa.Schema) -> pa.RecordBatch:
        fields = zip(*page.scalars, strict=True)
        kinds = [kind for _, kind in HIT_COLUMNS]
        columns = [pa.array(values, kind) for values, kind in zip(fields, kinds, strict=True)]
        for name in EMBEDDING_NAMES if self.embeddings else ():
            kind = schema.field(name).type
            held = page.vectors[name]
            if held is None:
                columns.append(pa.nulls(page.rows, kind))
                continue
            matrix, present = held
            columns.append(
                pa.FixedSizeListArray.from_arrays(
                    pa.array(matrix.reshape(-1)), type=kind, mask=pa.array(~present)
                )
            )
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def vector_matrix(column: pa.FixedSizeListArray) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A ``fixed_size_list<float32>`` column as a (rows, width) matrix: a null (a hit without
    that vector) is a row of NaN, as ``SearchPage.embedding_matrix`` gives it.

    ``asyncsearch.ray`` makes its tensor columns with it; here so that it is tested without Ray.
    """
    rows, width = len(column), column.type.list_size
    if column.null_count == 0:  # no copy
        whole: np.ndarray[Any, np.dtype[np.float32]] = column.flatten().to_numpy()
        return whole.reshape(rows, width)
    matrix = np.full((rows, width), np.nan, dtype=np.float32)
    valid = column.is_valid()
    present = column.filter(valid)
    matrix[valid.to_numpy(zero_copy_only=False)] = (
        present.flatten().to_numpy().reshape(len(present), width)
    )
    return matrix


def check_embedding_widths(widths: object) -> dict[EmbeddingName, int]:
    """``embedding_widths`` as a dict; ``InvalidRequestError`` for a bad name or width."""
    if widths is None:
        return {}
    if not isinstance(widths, Mapping):
        raise InvalidRequestError(
            f"embedding_widths must be a mapping or None, got {type(widths).__name__}"
        )
    checked: dict[EmbeddingName, int] = {}
    for name, width in widths.items():
        if width is None:
            continue  # not known: taken from the data
        if name not in EMBEDDING_NAMES:
            names = ", ".join(EMBEDDING_NAMES)
            raise InvalidRequestError(
                f"embedding_widths takes the embeddings {names}, got {name!r}"
            )
        if not isinstance(width, int) or isinstance(width, bool) or width < 0:
            raise InvalidRequestError(
                f"embedding_widths[{name!r}] must be an integer >= 0, got {width!r}"
            )
        checked[name] = width
    return checked


async def search_table(
    client: AsyncSearchClient,
    text: str | None = None,
    *,
    max_items: int | None = None,
    embeddings: bool = True,
    embedding_widths: Mapping[EmbeddingName, int] | None = None,
    start_page: int | None = None,
    max_pages: int | None = None,
    dedupe: bool = False,
    **params: Unpack[SearchWalkCallParams],
) -> pa.Table:
    """A search's hits as one ``pyarrow.Table``, walked as ``client.search_pages`` walks them.

    Takes the arguments of ``search_pages`` (the search's, and the call's options), and
    ``max_items`` to stop after that many hits. One row per hit: the columns of ``HIT_COLUMNS``
    and, unless ``embeddings=False`` (then the pages are decoded without their vectors, and the
    table has no embedding columns), ``small3_512`` and ``clip2`` as ``fixed_size_list<float32>``
    of the width the data shows (or ``embedding_widths`` fixes), null for a hit without one.
    The widths follow the rule of ``HitBatches``: a column with no vector among the first
    ``MAX_HELD_HITS`` hits is settled as absent (width 0, all null), and its later vectors are
    left out (logged), as ``asyncsearch.ray.read_search`` does.
    Raises ``InvalidRequestError`` before anything is sent for bad arguments, and the SDK's
    errors as the walk does; a vector of another width is a ``ResponseValidationError``.

    Args:
        client: The client to search with.
        text: The query text, as ``search`` takes it.
        max_items: Stop after this many hits.
        embeddings: ``False``: decode the pages without their vectors; no embedding columns.
        embedding_widths: Fix the width of an embedding column (e.g. ``{"clip2": 768}``).
        start_page: As ``search_pages`` takes it.
        max_pages: As ``search_pages`` takes it.
        dedupe: As ``search_pages`` takes it.
        **params: The call's ``SearchOptions``, applied to every page's request.

    Returns:
        One row per hit.
    """
    if max_items is not None and (
        not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 0
    ):
        raise InvalidRequestError(f"max_items must be an integer >= 0 or None, got {max_items!r}")
    # Each page becomes a record batch as it comes, while the next one is on its way; the
    # table at the end only collects them (no copy).
    builder = HitBatches(dict(check_embedding_widths(embedding_widths)), embeddings=embeddings)
    batches: list[pa.RecordBatch] = []
    page_size = params.get("page_size")
    if max_items and isinstance(page_size, int) and page_size > 0:
        # No page past the last one needed is requested, not even ahead of time.
        needed = -(-max_items // page_size)
        max_pages = needed if max_pages is None else min(max_pages, needed)
    if max_items != 0:
        taken = 0
        async with client.search_pages(
            text,
            start_page=start_page,
            max_pages=max_pages,
            dedupe=dedupe,
            embeddings=embeddings,
            **params,
        ) as pages:
            async for page in pages:
                room = None if max_items is None else max_items - taken
                batches += builder.add(page, room)
                taken += len(page.hits) if room is None else min(room, len(page.hits))
                if max_items is not None and taken >= max_items:
                    break
    batches += builder.finish()
    schema = builder.schema
    assert schema is not None  # settled by finish()
    return pa.Table.from_batches(batches, schema=schema)


def extraction_values(
    job: ExtractionJob | None, error: BaseException | None
) -> tuple[str | None, str | None, str | None]:
    """A result's ``state``, ``extraction`` (JSON text) and ``error`` ("Class: message")."""
    if error is not None:
        # An AsyncSearchError, or an error that is not ours (a bug below): reported against
        # its id with its class name either way.
        return None, None, f"{type(error).__name__}: {error}"
    assert job is not None
    extraction = None
    if job.extraction is not None:
        extraction = msgspec.json.encode(job.extraction).decode()
    return job.state, extraction, None


def extractions_batch(
    job_ids: Sequence[object], values: Sequence[tuple[str | None, str | None, str | None]]
) -> pa.RecordBatch:
    """A record batch of ``EXTRACTION_SCHEMA``: ``job_ids`` (as text) with their values.

    Args:
        job_ids: The ids, one per row.
        values: Per id: its state, extraction (JSON text) and error.

    Returns:
        The batch.
    """
    states, extractions, errors = zip(*values, strict=True) if values else ((), (), ())
    return pa.RecordBatch.from_arrays(
        [
            pa.array([None if j is None else str(j) for j in job_ids], pa.string()),
            pa.array(states, pa.string()),
            pa.array(extractions, pa.string()),
            pa.array(errors, pa.string()),
        ],
        schema=EXTRACTION_SCHEMA,
    )


def _values(result: ExtractionResult) -> tuple[str | None, str | None, str | None]:
    return extraction_values(result.job, result.error)


async def extractions_table(
    client: AsyncSearchClient,
    job_ids: Iterable[str | uuid.UUID] | AsyncIterable[str | uuid.UUID],
    *,
    concurrency: int = 16,
    format: ExtractionFormat | None = None,
    on_progress: Callable[[int, int | None], object] | None = None,
    **options: Unpack[RequestOptions],
) -> pa.Table:
    """The extraction jobs of ``job_ids`` as one ``pyarrow.Table`` of ``EXTRACTION_SCHEMA``.

    Fetched as ``client.gather_extractions`` fetches them (same arguments and options): one row
    per id given, in input order (an id given twice is two rows), a failed id a row with its
    ``error`` ("NotFoundError: ..."), never dropped. ``extraction`` is the job's extraction as
    JSON text in the wire form (re-encoded from the decoded job), null when it has none.

    Args:
        client: The client to fetch with.
        job_ids: A plain or async iterable of ids.
        concurrency: The most requests in flight.
        format: ``"json"`` or ``"markdown"``, as ``get_extraction`` takes it.
        on_progress: Called as ``on_progress(done, total)``, as ``gather_extractions`` calls it.
        **options: The call's ``RequestOptions``, applied to every request.

    Returns:
        One row per id given.
    """
    results = await client.gather_extractions(
        job_ids, concurrency=concurrency, format=format, on_progress=on_progress, **options
    )
    batch = extractions_batch([r.job_id for r in results], [_values(r) for r in results])
    return pa.Table.from_batches([batch], schema=EXTRACTION_SCHEMA)
