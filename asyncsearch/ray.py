"""Bulk extraction results and search exports on Ray Data (``pip install -e '.[ray]'``).

``import asyncsearch`` never imports this module (nor Ray, nor pyarrow): import
``asyncsearch.ray`` yourself.

- ``FetchExtractions``: a callable class for ``Dataset.map_batches``. Ray runs it as a pool of
  actors; each holds one ``AsyncSearchClient`` (one connection pool, one retry budget) for its
  whole life, and its ``async`` ``__call__`` turns a batch with a ``job_id`` column into a batch
  with the columns ``job_id``, ``state``, ``extraction`` (JSON text) and ``error``. Every id
  comes back exactly once; a failed id is a row with an error, never a failed batch.
- ``read_search(...)``: a search as a ``Dataset`` of hits with the columns of
  ``asyncsearch.arrow.search_table`` (the same ``HitBatches`` makes them, with the same rule for
  widths): the hit's scalar fields and the embeddings ``small3_512`` and ``clip2`` as Ray tensor
  columns of float32 (``ArrowTensorArray``), so that numpy batches hold each as one 2-D
  ``(rows, width)`` float32 array, a hit without that vector a row of NaN.
- ``SharedRateLimit(per_second, burst=...)``: one rate limit for a whole export, a ``RateLimit``
  whose tokens every process it is sent to leases from one Ray actor (``rate_limit=`` of
  ``FetchExtractions``, ``read_search`` or any client in a Ray task or actor).
- ``unwritten_job_ids(ids, path)``: the ids of a dataset that an earlier run has not written yet
  (``write_parquet``/``write_json``), to resume an export; ``retry_failed`` and
  ``refetch_in_progress`` also give back the ids written only with an error or in a state of
  ``IN_PROGRESS_JOB_STATES``, and take their rows out of the output, so that the resumed export
  leaves every id in it exactly once.

Actors of ``FetchExtractions`` mostly wait on the network: ask for a fraction of a CPU
(``num_cpus=0.25``), or on a small machine the actors take every CPU and the task that reads
the ids waits for them forever.

Errors of the SDK that a Ray task raises reach the driver as themselves (this module makes them
picklable), so ``except ResponseValidationError`` catches a failed ``read_search``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, Unpack, get_args

import anyio

from asyncsearch import (
    IN_PROGRESS_JOB_STATES,
    AsyncSearchClient,
    AsyncSearchError,
    ExtractionFormat,
    InvalidRequestError,
    RateLimit,
    RetryBudget,
    RetryPolicy,
    SearchFilters,
    SearchQuery,
    Sort,
    Timeout,
)
from asyncsearch.arrow import (
    EMBEDDING_NAMES,
    EXTRACTION_SCHEMA,
    MAX_HELD_HITS,
    EmbeddingName,
    HitBatches,
    check_embedding_widths,
    extraction_values,
    extractions_batch,
    needs_extra,
    vector_matrix,
)

with needs_extra("asyncsearch.ray needs Ray Data", "ray"):
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray
    import ray.data
    import ray.exceptions
    from ray.data.extensions import ArrowTensorArray

if TYPE_CHECKING:
    import aiohttp  # for an annotation only: the transport is the one module that uses it

__all__ = [
    "EXTRACTION_SCHEMA",
    "ClientOptions",
    "FetchExtractions",
    "QuotaUnavailableError",
    "SharedRateLimit",
    "read_search",
    "unwritten_job_ids",
]

#: The environment variables ``AsyncSearchClient`` reads its key and URL from (README: they are
#: part of the public contract; this edge module uses only the public API, so names them here).
_ENV_API_KEY = "ASYNCSEARCH_API_KEY"
_ENV_BASE_URL = "ASYNCSEARCH_BASE_URL"

T = TypeVar("T")


class ClientOptions(TypedDict, total=False):
    """Options of the ``AsyncSearchClient`` each actor or read task makes (see its docstring).

    Every keyword of ``AsyncSearchClient`` is here except ``api_key`` and ``base_url`` (their
    own parameters, resolved differently by ``FetchExtractions`` and ``read_search``) and
    ``session`` and ``ssl``, left out because they cannot be sent to another process. An option
    not given is not passed, so the client's own default applies (``retry_budget``: a fresh
    ``RetryBudget()`` per client; ``None`` turns it off). A ``RateLimit`` is copied to each
    process, each actor or read task getting a bucket of its own; a ``SharedRateLimit`` is one
    quota that all of them share.
    """

    base_id: str | None
    timeout: Timeout | float | None
    retry: RetryPolicy
    max_retries: int
    deadline: float | None
    middlewares: Sequence[Callable[[Any, Any], Any]]
    max_connections: int
    headers: Mapping[str, str] | None
    trust_env: bool
    proxy: str | None
    proxy_auth: aiohttp.BasicAuth | None
    rate_limit: RateLimit | None
    max_response_bytes: int
    allow_http: bool
    max_retry_after: float
    max_redirects: int
    first_page: int
    retry_budget: RetryBudget | None
    retry_search: Literal["safe", "always"]
    tracing: bool
    trace_content: bool | None


async def _named(coroutine: Coroutine[Any, Any, T], *, name: str) -> T:
    """Run ``coroutine`` in a task named ``name``: for ``run_coroutine_threadsafe``, which takes
    no name, so that every task the SDK starts is named ``asyncsearch.<component>.<role>``."""
    task = asyncio.current_task()
    if task is not None:
        task.set_name(name)
    return await coroutine


# ---------------------------------------------------------------------------------------------
# SDK errors across processes
# ---------------------------------------------------------------------------------------------


class QuotaUnavailableError(AsyncSearchError):
    """A ``SharedRateLimit``'s quota actor is gone or did not answer within its ``timeout``: the
    request was not sent, nor retried (``unwritten_job_ids(..., retry_failed=True)`` has it)."""


# ---------------------------------------------------------------------------------------------
# One quota for a whole export
# ---------------------------------------------------------------------------------------------


class _Quota:
    """The bucket of a ``SharedRateLimit``, in its actor: holding a token, it lends a lease at
    once, ahead of its refill (down to ``1 - lease``); else it says when to ask again."""

    def __init__(self, per_second: float, burst: int, lease: int) -> None:
        self.per_second, self.burst = per_second, burst
        # Every start (Ray's restarts too) is empty, a lease lent ahead: see SharedRateLimit.
        self._level, self._stamp = 1.0 - lease, time.monotonic()

    def level(self) -> float:  # below 0 while a lease is lent ahead of the refill
        now = time.monotonic()
        self._level = min(self.burst, self._level + (now - self._stamp) * self.per_second)
        self._stamp = now
        return self._level

    def lease(self, tokens: int) -> tuple[int, float]:
        """``tokens`` now, or none and the seconds until the bucket holds a token."""
        if self.level() < 1:
            return 0, (1 - self._level) / self.per_second
        self._level -= tokens
        return tokens, 0.0

    def give_back(self, tokens: int) -> None:
        """Take back the unused tokens of a lease (never above ``burst``)."""
        self._level = min(self.burst, self.level() + tokens)


class SharedRateLimit(RateLimit):
    """A ``RateLimit`` whose tokens come from one quota that every process it is sent to shares.

    Made on the driver (after ``ray.init``), it starts one Ray actor of its own holding the
    bucket, owned by the driver (not detached) and restarted by Ray (``max_restarts=-1``, empty
    again). It is picklable: give it as ``rate_limit`` to ``FetchExtractions``, ``read_search``
    or an ``AsyncSearchClient`` in any Ray task or actor; each process's copy leases at most
    ``lease`` tokens at once (a tenth of ``per_second``, at least 1), spendable for
    ``LEASE_SECONDS``, the rest given back by the client's ``aclose``. In any ``t`` seconds all
    copies send at most ``per_second * t + burst + lease * (copies + 1)`` requests. A lease not
    answered within ``timeout`` (10 s), or an actor Ray says is gone, fails the requests waiting
    for it with ``QuotaUnavailableError`` (nothing sent). ``tokens`` and ``waiting`` are this
    process's view; ``wait`` is a lower bound of the real wait. The Ray guide says more.

    Args:
        per_second: The tokens the quota gains per second: the rate of the whole export.
        burst: The most tokens the quota's bucket holds.

    Raises:
        ConfigurationError: A ``per_second`` that is not a positive finite number, or a
            ``burst`` that is not an integer of at least 1.
    """

    #: Seconds a lease may be spent for, from when it was asked for.
    LEASE_SECONDS = 1.0

    def __init__(self, per_second: float, *, burst: int = 1) -> None:
        super().__init__(per_second, burst=burst)
        #: The most tokens a copy leases at once.
        self.lease: int = max(1, int(self.per_second // 10))
        #: Seconds a copy waits for the quota actor's answer before failing the request.
        self.timeout: float = 10.0
        options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
        quota = ray.remote(_Quota).options(**options)
        self._actor: Any = quota.remote(self.per_second, self.burst, self.lease)
        self._start()

    def _start(self) -> None:  # this copy's state: nothing leased yet
        self.waiting = 0
        self._want, self._granted = 1, 0  # the size of the next lease; of the one in hand
        self._held, self._until, self._retry_at, self._asked = 0, -math.inf, -math.inf, 0.0
        self._asking: asyncio.Future[tuple[int, float]] | None = None  # the lease asked for
        self._queue = asyncio.Lock()  # this process's waiting requests: first come, first served
        self._failures, self._failure = 0, ""  # leases that did not come, and why the last

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy for another process: the same quota actor, nothing leased.
        return _shared_copy, (self._actor, self.per_second, self.burst, self.timeout)

    def __repr__(self) -> str:
        return f"SharedRateLimit(per_second={self.per_second:g}, burst={self.burst})"

    def _in_hand(self) -> bool:
        return self._held >= 1 and time.monotonic() < self._until

    @property
    def tokens(self) -> float:
        """The tokens left of this copy's lease (0 once it has expired)."""
        return float(self._held) if self._in_hand() else 0.0

    def wait(self, after: float = 0.0) -> float:
        """A lower bound of the seconds a request would wait for its token (see the class).

        Args:
            after: When the request asks, in seconds from now.

        Returns:
            0.0 when this copy's lease holds a token for it then; else the least it can wait.
        """
        now = time.monotonic()
        needed = self.waiting + 1 - (self._held if now + after < self._until else 0)
        if needed <= 0:
            return 0.0
        debt = max(0.0, self._retry_at - now)  # the quota said: no token before then
        spare = 0 if debt else self.burst - 1
        return max(0.0, debt + max(0, needed - self.lease - spare) / self.per_second - after)

    async def take(self) -> None:
        """Take a token of this copy's lease (leasing anew when it is spent), first come first
        served in this process; a wait cancelled takes none.

        Raises:
            QuotaUnavailableError: The quota actor did not answer within ``timeout``, or is gone.
        """
        if self.waiting or not self._in_hand():
            self.waiting += 1
            failures = self._failures
            try:
                async with self._queue:
                    while not self._in_hand():
                        if self._failures != failures:  # the lease this request waited for
                            raise QuotaUnavailableError(self._failure)
                        await self._renew()
            finally:
                self.waiting -= 1
        self._held -= 1

    async def _renew(self) -> None:
        """Ask for a lease: one question per copy, kept when its waiting request is cancelled."""
        await anyio.sleep(max(0.0, self._retry_at - time.monotonic()))
        if self._asking is None:
            if self._granted:  # the lease in hand ends: the next is twice what was spent of it
                self._want = min(self.lease, max(1, 2 * (self._granted - self._held)))
            self._asked = time.monotonic()
            self._asking = asyncio.wrap_future(self._actor.lease.remote(self._want).future())
        asking = self._asking
        try:
            if not asking.done():
                with anyio.fail_after(max(0.0, self._asked + self.timeout - time.monotonic())):
                    await asyncio.shield(asking)
            granted, retry_in = asking.result()
        except (TimeoutError, ray.exceptions.RayError) as exc:
            self._asking = None  # the next request asks again
            self._failures += 1
            why = f"cannot be reached ({type(exc).__name__})"
            if isinstance(exc, TimeoutError):
                why = f"did not answer within {self.timeout:g}s"
            self._failure = f"the quota actor of {self!r} {why}; the request was not sent"
            raise QuotaUnavailableError(self._failure) from exc
        self._asking = None
        self._held = self._granted = granted
        self._until = self._asked + self.LEASE_SECONDS
        self._retry_at = time.monotonic() + retry_in

    def give_back(self, tokens: int = 1) -> None:
        """Put back the tokens of requests not sent into this copy's lease (if not expired).

        Args:
            tokens: How many.
        """
        if time.monotonic() < self._until:
            self._held = min(self.lease, self._held + tokens)

    async def release(self) -> None:
        """Return this copy's unused lease to the quota (the client's ``aclose`` calls it; an
        unreachable quota is waited for at most ``timeout``); the next request leases anew."""
        held, self._held = (self._held if self._in_hand() else 0), 0
        if held:
            with anyio.move_on_after(self.timeout), contextlib.suppress(ray.exceptions.RayError):
                await asyncio.wrap_future(self._actor.give_back.remote(held).future())


def _shared_copy(actor: Any, per_second: float, burst: int, timeout: float) -> SharedRateLimit:
    """A ``SharedRateLimit`` unpickled in another process: the same quota, nothing leased."""
    limit = SharedRateLimit.__new__(SharedRateLimit)
    RateLimit.__init__(limit, per_second, burst=burst)
    limit.lease, limit.timeout, limit._actor = max(1, int(per_second // 10)), timeout, actor
    limit._start()
    return limit


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

    Args:
        api_key: As for ``AsyncSearchClient``; None reads ``ASYNCSEARCH_API_KEY`` in the
            actor's process (on a cluster, pass it in ``runtime_env={"env_vars": ...}`` or here).
        base_url: As for ``AsyncSearchClient``; None reads ``ASYNCSEARCH_BASE_URL`` in the
            actor's process.
        concurrency: The most requests in flight per actor.
        format: ``"json"`` or ``"markdown"``, as for ``get_extraction``.
        **options: The other client options (``ClientOptions``); a ``retry_budget`` there is
            copied for each actor (``None`` turns it off; by default each actor has a fresh
            ``RetryBudget()``).

    Raises:
        InvalidRequestError: A bad argument, when the actor starts, before anything is sent.
        ConfigurationError: A bad client option, likewise.
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
        return pa.Table.from_batches([extractions_batch(job_ids, rows)], schema=EXTRACTION_SCHEMA)

    async def _fetch_one(self, job_id: object) -> tuple[str | None, str | None, str | None]:
        assert self._limiter is not None
        if not isinstance(job_id, str | uuid.UUID):
            what = "null" if job_id is None else f"a {type(job_id).__name__}"
            return None, None, f"InvalidRequestError: job_id must be a string, got {what}"
        try:
            async with self._limiter:
                job = await self._client.get_extraction(job_id, format=self._format)
        except Exception as exc:  # errors are values here: one id must never fail the batch
            return extraction_values(None, exc)
        return extraction_values(job, None)

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


# ---------------------------------------------------------------------------------------------
# Search results as a dataset
# ---------------------------------------------------------------------------------------------


class _SearchWalk:
    """The read step of ``read_search``: walks the search's pages, one block per page."""

    def __init__(
        self,
        client_arguments: dict[str, Any],
        pages_arguments: dict[str, Any],
        *,
        embedding_widths: Mapping[EmbeddingName, int] | None = None,
        max_held_hits: int = MAX_HELD_HITS,
    ) -> None:
        self._client_arguments = client_arguments
        self._pages_arguments = pages_arguments
        self._embedding_widths = dict(embedding_widths or {})
        self._max_held_hits = max_held_hits

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

        tables = HitBatches(dict(self._embedding_widths), self._max_held_hits)
        try:
            client, pager = run(start())
            try:
                while True:
                    try:
                        page = run(pager.__anext__())
                    except StopAsyncIteration:
                        break
                    yield from _blocks(tables.add(page))
                yield from _blocks(tables.finish())
            finally:
                try:
                    run(pager.aclose())
                finally:  # the client is closed even when closing the pager fails
                    run(client.aclose())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _blocks(batches: list[pa.RecordBatch]) -> Iterator[Any]:
    for batch in batches:
        yield _with_tensor_columns(pa.Table.from_batches([batch]))


def _with_tensor_columns(table: pa.Table) -> pa.Table:
    """``table`` with its vector columns as Ray tensor columns: numpy batches get them as 2-D
    float32 arrays (a ``fixed_size_list`` column becomes a 1-D array of arrays)."""
    for name in EMBEDDING_NAMES:
        index = table.schema.get_field_index(name)
        if index >= 0:
            column = table.column(index).combine_chunks()
            tensors = ArrowTensorArray.from_numpy(vector_matrix(column), column_name=name)
            table = table.set_column(index, name, tensors)
    return table


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
    embedding_widths: Mapping[EmbeddingName, int] | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    **options: Unpack[ClientOptions],
) -> Any:
    """A search's hits as a Ray ``Dataset``, one row per hit in the service's order.

    Takes the arguments of ``search_pages`` (those of ``search`` except ``page``; the walk ends
    as ``search_pages`` says) and the client options. The columns are those of
    ``asyncsearch.arrow.search_table``, made by the same ``HitBatches``: the hit's scalar fields
    (``HIT_COLUMNS``: ``id``, ``name``, ``kind``, ``score``, ...; null where the service sent
    none), and ``small3_512`` and ``clip2`` as Ray tensor columns of float32 of shape
    ``(width,)`` (``ray.data.extensions.ArrowTensorArray``): ``iter_batches(batch_format=
    "numpy")`` gives each as a 2-D ``(rows, width)`` float32 array, ready for a model, and a hit
    without that embedding is a row of NaN (as ``SearchPage.embedding_matrix`` gives it). The
    vectors go from each page's matrix into the tensor buffers without a Python list per hit.

    The widths follow the one rule of ``asyncsearch.arrow.HitBatches``, as in ``search_table``:
    each column is as wide as the first vector of its name in the search; a hit whose vector
    has another width fails the read with a ``ResponseValidationError`` (never a column of mixed
    or cut vectors). Pages before that first vector are held back in the read task, at most
    ``MAX_HELD_HITS`` (10,000) hits; a column with no vector among them (or in the whole
    search) is settled as absent, width 0, and a vector of it coming later is left out (NaN),
    logged once as a WARNING (in the read task's log), never an error. ``embedding_widths``
    (e.g. ``{"clip2": 768}``) fixes the width of a column instead, so nothing is held back for
    it and no vector of it is left out, and checks every vector against it.

    Arguments and options are checked now, before anything is sent; ``api_key`` and
    ``base_url`` fall back to the environment of this (the driver's) process. The pages are
    walked in one Ray task (a page is requested only once the previous one said there are
    more), with its next page prefetched while Ray handles the current one; each page is one
    output of that task (Ray may join small ones into one block). ``ray_remote_args`` (e.g.
    ``{"num_cpus": 0.5}``) go to that task.

    Raises ``InvalidRequestError``/``ConfigurationError`` for bad arguments; a failing search
    fails the dataset's execution with the SDK's typed error.

    Args:
        text: The query text, as ``search`` takes it.
        image: As ``search`` takes it.
        resource_id: As ``search`` takes it.
        filters: As ``search`` takes it.
        precision: As ``search`` takes it.
        queries: As ``search`` takes it.
        incognito: As ``search`` takes it.
        page_size: As ``search`` takes it.
        sort: As ``search`` takes it.
        start_page: As ``search_pages`` takes it.
        max_pages: As ``search_pages`` takes it.
        dedupe: As ``search_pages`` takes it.
        embedding_widths: Fix the width of an embedding column (e.g. ``{"clip2": 768}``).
        api_key: As ``AsyncSearchClient`` takes it; ``None``: this process's environment.
        base_url: As ``AsyncSearchClient`` takes it; ``None``: this process's environment.
        ray_remote_args: Ray's options of the task that walks the pages.
        **options: The other client options (``ClientOptions``).

    Returns:
        A Ray ``Dataset`` of the hits.
    """
    widths = check_embedding_widths(embedding_widths)
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
        _SearchWalk(client_arguments, pages_arguments, embedding_widths=widths),
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
    refetch_in_progress: bool = False,
) -> Any:
    """The rows of ``ids`` (a Dataset with a ``job_id`` column) whose id is not yet written.

    ``written`` is the output of earlier runs of ``FetchExtractions`` (a directory or files
    written by ``write_parquet`` or ``write_json``, as local paths or URIs such as ``s3://...``;
    a path with nothing there yet means nothing is written). An id is written once it has a
    final row there. By default every row is final; two options make some rows worth fetching
    again, so that their ids come back:

    - ``retry_failed``: a row with an error (a 404, an exhausted retry, a bad id, ...).
    - ``refetch_in_progress``: a row without an error whose ``state`` is one of
      ``asyncsearch.IN_PROGRESS_JOB_STATES`` (``pending``): a job that had not
      finished when it was fetched. Any other state is final, whatever it is, one the SDK does
      not know included: the spec names only ``pending`` and never says which states are final.

    With either option, the rows to be fetched again are taken out of ``written`` now, so that
    after the export writes those ids again the output holds every id exactly once, for any
    reader. Each file that holds such a row is rewritten without it (to a hidden file first,
    which readers skip, then moved over the original; a file left with no rows is deleted),
    from the driver. Until the export has written them, those ids are simply not written: a run
    stopped in between loses nothing, and the next resume fetches them even without the option.
    Only rows of ids that are in ``ids`` are taken out (``ids`` is read once more to find them,
    only when there are any), along with the rows that are stale because the same id also has a
    final row (as an earlier version of this function left them). The written ids are collected
    on the driver (a set of strings: about 100 bytes an id) and the filter runs on the cluster.

    Args:
        ids: A Dataset with a ``job_id`` column.
        written: The output of earlier runs (a directory, files or URIs).
        format: The format of ``written``: ``"parquet"`` or ``"json"``.
        retry_failed: Fetch again the ids whose row has an error.
        refetch_in_progress: Fetch again the ids whose job was in progress.

    Returns:
        The rows of ``ids`` to fetch.
    """
    if format not in ("parquet", "json"):
        raise InvalidRequestError(f"format must be 'parquet' or 'json', got {format!r}")

    def again(error: object, state: object) -> bool:
        if error is not None:
            return retry_failed
        return refetch_in_progress and state in IN_PROGRESS_JOB_STATES

    output = _read_written(
        written, format=format, fetch_again=again, with_state=refetch_in_progress
    )
    if output.again:
        stale = output.again.keys() & output.final
        wanted = output.again.keys() - output.final
        drop = stale | (_ids_among(ids, wanted) if wanted else set())
        for path in sorted({path for job_id in drop for path in output.again[job_id]}):
            _drop_rows(output.filesystem, path, format=format, drop=drop, fetch_again=again)
    done = output.final
    if not done:
        return ids

    def keep(batch: Any) -> Any:
        return batch.filter(pa.array([i not in done for i in batch["job_id"].to_pylist()]))

    return ids.map_batches(keep, batch_format="pyarrow")


@dataclass
class _Written:
    """The ids an earlier export wrote, by whether a row of theirs is final."""

    filesystem: Any = None
    #: The ids with a final row.
    final: set[str] = field(default_factory=set)
    #: The ids with a row to fetch again, each with the files that hold such a row of it.
    again: dict[str, set[str]] = field(default_factory=dict)


def _read_written(
    written: str | Sequence[str],
    *,
    format: Literal["parquet", "json"],
    fetch_again: Callable[[object, object], bool],
    with_state: bool,
) -> _Written:
    paths = [written] if isinstance(written, str) else list(written)
    paths = [p for p in paths if _has_output(p)]
    output = _Written()
    if not paths:
        return output
    # The paths Ray gives back (include_paths) are paths of the filesystem the first one names.
    if "://" in paths[0]:
        output.filesystem = pafs.FileSystem.from_uri(paths[0])[0]
    else:
        output.filesystem = pafs.LocalFileSystem()
    read = ray.data.read_parquet if format == "parquet" else ray.data.read_json
    dataset = read(paths, include_paths=True)
    # The state is read only when it matters: an output without one still reads as before.
    columns = ["job_id", "error", "path", *(["state"] if with_state else [])]
    dataset = dataset.select_columns(columns)
    batches: Iterable[Any] = dataset.iter_batches(batch_format="pyarrow", batch_size=65536)
    for batch in batches:
        states = batch["state"].to_pylist() if with_state else [None] * batch.num_rows
        for job_id, error, state, path in zip(
            batch["job_id"].to_pylist(),
            batch["error"].to_pylist(),
            states,
            batch["path"].to_pylist(),
            strict=True,
        ):
            if job_id is None:
                continue
            if fetch_again(error, state):
                output.again.setdefault(job_id, set()).add(path)
            else:
                output.final.add(job_id)
    return output


def _ids_among(ids: Any, wanted: set[str]) -> set[str]:
    """The ids of ``wanted`` that the Dataset ``ids`` holds (found on the cluster)."""

    def pick(batch: Any) -> Any:
        mask = pa.array([i in wanted for i in batch["job_id"].to_pylist()], pa.bool_())
        return batch.select(["job_id"]).filter(mask)

    found: set[str] = set()
    batches: Iterable[Any] = ids.map_batches(pick, batch_format="pyarrow").iter_batches(
        batch_format="pyarrow", batch_size=65536
    )
    for batch in batches:
        found.update(batch["job_id"].to_pylist())
    return found


def _drop_rows(
    filesystem: Any,
    path: str,
    *,
    format: Literal["parquet", "json"],
    drop: set[str],
    fetch_again: Callable[[object, object], bool],
) -> None:
    """Rewrite the file ``path`` without its rows to fetch again whose id is in ``drop``.

    The rest is written to a hidden file beside it (Ray's readers skip names that start with a
    dot) and moved over it, so a reader or a stopped run sees either the old file or the new
    one; a file left with no rows is deleted.
    """

    def dropped(row: Mapping[str, Any]) -> bool:
        return row.get("job_id") in drop and fetch_again(row.get("error"), row.get("state"))

    folder, _, name = path.rpartition("/")
    # The name ends as the original's does, so that compression="detect" picks the same codec.
    temporary = f".asyncsearch-{uuid.uuid4().hex}-{name}"
    if folder:
        temporary = f"{folder}/{temporary}"
    if format == "parquet":
        with filesystem.open_input_file(path) as source:
            table = pq.read_table(source)
        columns = [c for c in ("job_id", "error", "state") if c in table.column_names]
        rows = table.select(columns).to_pylist()
        mask = pa.array([not dropped(row) for row in rows], pa.bool_())
        kept = table.filter(mask)
        if kept.num_rows == table.num_rows:
            return
        if kept.num_rows == 0:
            filesystem.delete_file(path)
            return
        pq.write_table(kept, temporary, filesystem=filesystem)
    else:
        with filesystem.open_input_stream(path, compression="detect") as source:
            lines = bytes(source.read()).splitlines(keepends=True)
        kept_lines = []
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    raise ValueError(
                        f"cannot take rows out of {path}: line {number} is not JSON (only the"
                        " JSON lines of write_json can be rewritten)"
                    ) from None
                if isinstance(row, dict) and dropped(row):
                    continue
            kept_lines.append(line)
        if len(kept_lines) == len(lines):
            return
        if not any(line.strip() for line in kept_lines):
            filesystem.delete_file(path)
            return
        with filesystem.open_output_stream(temporary, compression="detect") as sink:
            sink.write(b"".join(kept_lines))
    filesystem.move(temporary, path)


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
