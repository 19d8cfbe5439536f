"""Bulk extraction results and search exports on Ray Data (``pip install 'asyncsearch[ray]'``).

``import asyncsearch`` never imports this module (nor Ray, nor pyarrow): import
``asyncsearch.ray`` yourself.

- ``FetchExtractions``: a callable class for ``Dataset.map_batches``. Ray runs it as a pool of
  actors; each holds one ``AsyncSearchClient`` (one connection pool, one retry budget) for its
  whole life, and its ``async`` ``__call__`` turns a batch with a ``job_id`` column into a batch
  with the columns ``job_id``, ``state``, ``extraction`` (JSON text) and ``error``. Every id
  comes back exactly once; a failed id is a row with an error, never a failed batch.
- ``read_search(...)``: a search as a ``Dataset`` of hits with the columns ``id``, ``name``,
  ``score`` and the embeddings as fixed-shape float32 tensor columns ``small3_512`` (512) and
  ``clip2`` (768), made from each page's ``SearchPage.embedding_matrix``.
- ``unwritten_job_ids(ids, path)``: the ids of a dataset that an earlier run has not written yet
  (``write_parquet``/``write_json``), to resume an export.

Actors of ``FetchExtractions`` mostly wait on the network: ask for a fraction of a CPU
(``num_cpus=0.25``), or on a small machine the actors take every CPU and the task that reads
the ids waits for them forever.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypedDict, TypeVar, Unpack, get_args

import anyio
import msgspec

from asyncsearch import (
    AsyncSearchClient,
    ExtractionFormat,
    InvalidRequestError,
    ResponseValidationError,
    RetryBudget,
    SearchFilters,
    SearchPage,
    SearchQuery,
    Sort,
    Timeout,
)

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.fs as pafs
    import ray
    import ray.data
    from ray.data.extensions import ArrowTensorArray
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "asyncsearch.ray needs Ray Data: pip install 'asyncsearch[ray]'"
        f" ({exc.name or exc} is missing)"
    ) from exc

__all__ = [
    "EMBEDDING_DIMENSIONS",
    "EXTRACTION_SCHEMA",
    "ClientOptions",
    "FetchExtractions",
    "read_search",
    "unwritten_job_ids",
]

#: The embedding columns of ``read_search`` and their fixed number of float32 values per hit.
EMBEDDING_DIMENSIONS: Mapping[Literal["small3_512", "clip2"], int] = {
    "small3_512": 512,
    "clip2": 768,
}

#: The environment variables ``AsyncSearchClient`` reads its key and URL from (README: they are
#: part of the public contract; this edge module uses only the public API, so names them here).
_ENV_API_KEY = "ASYNCSEARCH_API_KEY"
_ENV_BASE_URL = "ASYNCSEARCH_BASE_URL"

T = TypeVar("T")

#: The columns ``FetchExtractions`` returns (typed, so a batch of only nulls keeps its types).
EXTRACTION_SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string()),
        pa.field("state", pa.string()),
        pa.field("extraction", pa.string()),
        pa.field("error", pa.string()),
    ]
)


class ClientOptions(TypedDict, total=False):
    """Options of the ``AsyncSearchClient`` each actor or read task makes (see its docstring).

    Every keyword of ``AsyncSearchClient`` is here except ``api_key`` and ``base_url`` (their
    own parameters, resolved differently by ``FetchExtractions`` and ``read_search``) and
    ``session`` and ``ssl``, left out because they cannot be sent to another process. An option
    not given is not passed, so the client's own default applies (``retry_budget``: a fresh
    ``RetryBudget()`` per client; ``None`` turns it off).
    """

    base_id: str | None
    timeout: Timeout | float | None
    max_retries: int
    max_connections: int
    headers: Mapping[str, str] | None
    trust_env: bool
    max_response_bytes: int
    allow_http: bool
    max_retry_after: float
    max_redirects: int
    first_page: int
    retry_budget: RetryBudget | None
    retry_search: Literal["safe", "always"]


async def _named(coroutine: Coroutine[Any, Any, T], *, name: str) -> T:
    """Run ``coroutine`` in a task named ``name``: for ``run_coroutine_threadsafe``, which takes
    no name, so that every task the SDK starts is named ``asyncsearch.<component>.<role>``."""
    task = asyncio.current_task()
    if task is not None:
        task.set_name(name)
    return await coroutine


# ---------------------------------------------------------------------------------------------
# Extraction results as a transform
# ---------------------------------------------------------------------------------------------


class FetchExtractions:
    """Fetch the extraction job of every ``job_id`` of a batch: a class for ``map_batches``.

    ::

        ds.map_batches(
            FetchExtractions,
            fn_constructor_kwargs={"api_key": key, "base_url": url, "concurrency": 32},
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=4),
            num_cpus=0.25,
        )

    Ray makes one instance per actor and keeps it for the actor's life, so each actor holds one
    ``AsyncSearchClient``: one connection pool, one retry budget. ``__call__`` is ``async``
    (Ray Data runs it on the actor's event loop, several batches at a time); at most
    ``concurrency`` requests are in flight per actor across all of its batches.

    The batch (any format: pyarrow, numpy or pandas) needs a ``job_id`` column. The result is a
    pyarrow Table with one row per input row, in input order, and the columns of
    ``EXTRACTION_SCHEMA``: ``job_id`` (as given), ``state``, ``extraction`` (the job's
    extraction as JSON text in the wire form, null when the job has none yet) and ``error``
    (null, or ``"NotFoundError: ..."``: the error's class name and message). A 404, an
    exhausted retry, a bad body or an invalid id is a row with an error: one id never fails a
    batch.

    Parameters:
        api_key, base_url: as for ``AsyncSearchClient``; None reads ``ASYNCSEARCH_API_KEY`` and
            ``ASYNCSEARCH_BASE_URL`` in the actor's process (on a cluster, pass them in
            ``runtime_env={"env_vars": ...}`` or here).
        concurrency: the most requests in flight per actor.
        format: ``"json"`` or ``"markdown"``, as for ``get_extraction``.
        retry_budget: a ``RetryBudget`` (each actor gets its own copy), or None to turn it off;
            by default each actor has a fresh ``RetryBudget()``.
        **options: the other client options (``ClientOptions``).

    Raises ``InvalidRequestError`` or ``ConfigurationError`` for bad parameters when the actor
    starts, before anything is sent.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        concurrency: int = 16,
        format: ExtractionFormat | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise InvalidRequestError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if format is not None and format not in get_args(ExtractionFormat):
            formats = ", ".join(get_args(ExtractionFormat))
            raise InvalidRequestError(f"format must be one of {formats} or None, got {format!r}")
        self._format: ExtractionFormat | None = format
        self._concurrency = concurrency
        self._client = AsyncSearchClient(api_key, base_url=base_url, **options)
        # Made on the first call, inside the actor's event loop (the constructor runs outside).
        self._limiter: anyio.CapacityLimiter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"FetchExtractions({self._client!r}, concurrency={self._concurrency})"

    async def __call__(self, batch: Any) -> Any:
        """Fetch the jobs of ``batch["job_id"]``; a pyarrow Table of ``EXTRACTION_SCHEMA``."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._concurrency)
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.current_thread()
        job_ids = _job_id_column(batch)
        rows: list[tuple[str | None, str | None, str | None]] = [(None, None, None)] * len(job_ids)

        async def fetch(index: int, job_id: object) -> None:
            rows[index] = await self._fetch_one(job_id)

        # One task per row of the batch (a batch is bounded); the actor-wide limiter bounds the
        # requests in flight, also across the batches Ray runs at once on this actor.
        async with anyio.create_task_group() as tasks:
            for index, job_id in enumerate(job_ids):
                tasks.start_soon(fetch, index, job_id, name="asyncsearch.ray.fetch")
        states, extractions, errors = zip(*rows, strict=True) if rows else ((), (), ())
        return pa.Table.from_arrays(
            [
                pa.array([_id_text(j) for j in job_ids], pa.string()),
                pa.array(states, pa.string()),
                pa.array(extractions, pa.string()),
                pa.array(errors, pa.string()),
            ],
            schema=EXTRACTION_SCHEMA,
        )

    async def _fetch_one(self, job_id: object) -> tuple[str | None, str | None, str | None]:
        assert self._limiter is not None
        if not isinstance(job_id, str | uuid.UUID):
            what = "null" if job_id is None else f"a {type(job_id).__name__}"
            return None, None, f"InvalidRequestError: job_id must be a string, got {what}"
        try:
            async with self._limiter:
                job = await self._client.get_extraction(job_id, format=self._format)
        except Exception as exc:  # errors are values here: one id must never fail the batch
            return None, None, _error_text(exc)
        extraction = None
        if job.extraction is not None:
            extraction = msgspec.json.encode(job.extraction).decode()
        return job.state, extraction, None

    async def aclose(self) -> None:
        """Close the actor's client (Ray calls ``__del__``, which does this, when the actor
        ends)."""
        await self._client.aclose()

    def __del__(self) -> None:
        # Ray Data drops the instance when the actor ends; its event loop runs in another thread
        # of the actor, and the client's connection pool belongs to that loop.
        # getattr: __init__ may have raised (a bad parameter) before the attribute was set.
        loop: asyncio.AbstractEventLoop | None = getattr(self, "_loop", None)
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        try:
            future = asyncio.run_coroutine_threadsafe(
                _named(self._client.aclose(), name="asyncsearch.ray.close"), loop
            )
            # Waiting from the loop's own thread would wait forever: there, only schedule it.
            if threading.current_thread() is not self._loop_thread:
                future.result(timeout=5)
        except Exception:
            pass  # nothing more to do while the actor goes away


def _job_id_column(batch: Any) -> list[object]:
    try:
        column = batch["job_id"]
    except (KeyError, IndexError, TypeError):
        column = None
    if column is None:
        names = getattr(batch, "column_names", None) or list(getattr(batch, "keys", list)())
        raise InvalidRequestError(f"the batch has no 'job_id' column (its columns: {names})")
    if hasattr(column, "to_pylist"):  # a pyarrow column
        values: list[object] = column.to_pylist()
        return values
    # numpy or pandas: numpy.str_ becomes a plain str; anything else stays as it is (and is
    # refused per row).
    return [str(v) if isinstance(v, str) else v for v in column]


def _id_text(job_id: object) -> str | None:
    if job_id is None:
        return None
    return str(job_id)


def _error_text(error: BaseException) -> str:
    # An AsyncSearchError, or an error that is not ours (a bug somewhere below): either way it
    # is reported against its id with its class name, never raised through the batch.
    return f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------------------------------------
# Search results as a dataset
# ---------------------------------------------------------------------------------------------


def _hit_schema() -> Any:
    return pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("name", pa.string()),
            pa.field("score", pa.float64()),
            *(
                pa.field(name, ArrowTensorArray.from_numpy(np.zeros((1, dim), np.float32)).type)
                for name, dim in EMBEDDING_DIMENSIONS.items()
            ),
        ]
    )


def _embedding_column(page: SearchPage, name: Literal["small3_512", "clip2"], dim: int) -> Any:
    try:
        matrix = page.embedding_matrix(name)
    except ValueError as exc:
        raise ResponseValidationError(
            f"the hits' {name} embeddings disagree on their size: {exc}",
            path=f"$.hits[*].embeddings.{name}",
            body=b"",
        ) from None
    if matrix.shape[1] == 0:  # no hit of the page has this embedding: NaN rows, as for one hit
        matrix = np.full((len(page.hits), dim), np.nan, dtype=np.float32)
    elif matrix.shape[1] != dim:
        raise ResponseValidationError(
            f"the hits' {name} embeddings have {matrix.shape[1]} values where {dim} are expected",
            path=f"$.hits[*].embeddings.{name}",
            body=b"",
        )
    return ArrowTensorArray.from_numpy(matrix)


def _hits_table(page: SearchPage) -> Any:
    """One page of hits as a pyarrow Table: id, name, score and the two tensor columns."""
    hits = page.hits
    columns = [
        pa.array([hit.id for hit in hits], pa.string()),
        pa.array([hit.name for hit in hits], pa.string()),
        pa.array([hit.score for hit in hits], pa.float64()),
        *(_embedding_column(page, name, dim) for name, dim in EMBEDDING_DIMENSIONS.items()),
    ]
    return pa.Table.from_arrays(columns, schema=_hit_schema())


class _SearchWalk:
    """The read step of ``read_search``: walks the search's pages, one block per page."""

    def __init__(self, client_arguments: dict[str, Any], pages_arguments: dict[str, Any]) -> None:
        self._client_arguments = client_arguments
        self._pages_arguments = pages_arguments

    def __call__(self, batch: Any) -> Iterator[Any]:
        # The walk runs on its own event loop in a thread of this worker, so that the pager's
        # prefetch of the next page goes on while Ray handles the block of the current one.
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_forever, name="asyncsearch.ray.read_search", daemon=True
        )
        thread.start()

        def run(coroutine: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(
                _named(coroutine, name="asyncsearch.ray.read_search"), loop
            ).result()

        async def start() -> Any:
            client = AsyncSearchClient(**self._client_arguments)
            return client, client.search_pages(**self._pages_arguments)

        try:
            client, pager = run(start())
            try:
                while True:
                    try:
                        page = run(pager.__anext__())
                    except StopAsyncIteration:
                        return
                    if page.hits:
                        yield _hits_table(page)
            finally:
                try:
                    run(pager.aclose())
                finally:  # the client is closed even when closing the pager fails
                    run(client.aclose())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def read_search(
    text: str | None = None,
    *,
    image: str | None = None,
    resource_id: str | uuid.UUID | None = None,
    filters: SearchFilters | Mapping[str, Any] | None = None,
    precision: float | None = None,
    queries: Sequence[SearchQuery | Mapping[str, Any]] | None = None,
    incognito: bool | None = None,
    page_size: int | None = None,
    sort: Sort | Mapping[str, Any] | None = None,
    start_page: int | None = None,
    max_pages: int | None = None,
    dedupe: bool = False,
    api_key: str | None = None,
    base_url: str | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    **options: Unpack[ClientOptions],
) -> Any:
    """A search's hits as a Ray ``Dataset``, one row per hit in the service's order.

    Takes the arguments of ``search_pages`` (those of ``search`` except ``page``; the walk ends
    as ``search_pages`` says) and the client options. The columns are ``id``, ``name``,
    ``score`` (null where the service sent none), and ``small3_512`` and ``clip2``: fixed-shape
    float32 tensors of 512 and 768 values (a row of NaN for a hit without that embedding),
    made from each page's ``SearchPage.embedding_matrix`` without a Python list per hit.

    Arguments and options are checked now, before anything is sent; ``api_key`` and
    ``base_url`` fall back to the environment of this (the driver's) process. The pages are
    walked in one Ray task (a page is requested only once the previous one said there are
    more), with its next page prefetched while Ray handles the current one, and each page is
    one block. ``ray_remote_args`` (e.g. ``{"num_cpus": 0.5}``) go to that task.

    Raises ``InvalidRequestError``/``ConfigurationError`` for bad arguments; a failing search
    fails the dataset's execution with the SDK's typed error.
    """
    # The key and URL are resolved in this process, so the read task needs no environment.
    client_arguments: dict[str, Any] = {
        **options,
        "api_key": os.environ.get(_ENV_API_KEY) if api_key is None else api_key,
        "base_url": os.environ.get(_ENV_BASE_URL) if base_url is None else base_url,
    }
    # Made here to check the options now; it never sends anything (its connection pool is made
    # on the first request), so it needs no closing.
    probe = AsyncSearchClient(**client_arguments)
    pages_arguments: dict[str, Any] = {
        "text": text,
        "image": image,
        "resource_id": resource_id,
        "filters": filters,
        "precision": precision,
        "queries": queries,
        "incognito": incognito,
        "page_size": page_size,
        "sort": sort,
        "start_page": start_page,
        "max_pages": max_pages,
        "dedupe": dedupe,
    }
    probe.search_pages(**pages_arguments)  # validates every argument now
    return ray.data.from_items([{"walk": 0}]).map_batches(
        _SearchWalk(client_arguments, pages_arguments),
        batch_size=1,
        batch_format="pyarrow",
        **dict(ray_remote_args or {}),
    )


# ---------------------------------------------------------------------------------------------
# Resuming an export
# ---------------------------------------------------------------------------------------------


def unwritten_job_ids(
    ids: Any,
    written: str | Sequence[str],
    *,
    format: Literal["parquet", "json"] = "parquet",
    retry_failed: bool = False,
) -> Any:
    """The rows of ``ids`` (a Dataset with a ``job_id`` column) whose id is not yet written.

    ``written`` is the output of earlier runs of ``FetchExtractions`` (a directory or files
    written by ``write_parquet`` or ``write_json``, as local paths or URIs such as ``s3://...``;
    a path with nothing there yet means nothing is written). With ``retry_failed`` the ids
    written only with an error count as not written, so they are fetched again. The written
    ids are collected on the driver (a set of strings: about 100 bytes an id) and the filter
    runs on the cluster.
    """
    if format not in ("parquet", "json"):
        raise InvalidRequestError(f"format must be 'parquet' or 'json', got {format!r}")
    done = _written_ids(written, format=format, retry_failed=retry_failed)
    if not done:
        return ids

    def keep(batch: Any) -> Any:
        return batch.filter(pa.array([i not in done for i in batch["job_id"].to_pylist()]))

    return ids.map_batches(keep, batch_format="pyarrow")


def _written_ids(
    written: str | Sequence[str], *, format: Literal["parquet", "json"], retry_failed: bool
) -> set[str]:
    paths = [written] if isinstance(written, str) else list(written)
    paths = [p for p in paths if _has_output(p)]
    if not paths:
        return set()
    dataset = ray.data.read_parquet(paths) if format == "parquet" else ray.data.read_json(paths)
    dataset = dataset.select_columns(["job_id", "error"])
    done: set[str] = set()
    failed: set[str] = set()
    batches: Iterable[Any] = dataset.iter_batches(batch_format="pyarrow", batch_size=65536)
    for batch in batches:
        for job_id, error in zip(
            batch["job_id"].to_pylist(), batch["error"].to_pylist(), strict=True
        ):
            if job_id is None:
                continue
            (failed if error is not None else done).add(job_id)
    if retry_failed:
        return done
    return done | failed


def _has_output(path: str) -> bool:
    """Whether ``path`` (a local path or a URI such as ``s3://...``) holds anything written."""
    if "://" not in path:
        return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))
    # A URI (s3://, gs://, file://, ...): os.path knows nothing of it, so ask its filesystem.
    filesystem, inner = pafs.FileSystem.from_uri(path)
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        return False
    if info.type == pafs.FileType.Directory:
        return bool(filesystem.get_file_info(pafs.FileSelector(inner, recursive=False)))
    return True
