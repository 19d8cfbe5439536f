"""``--parquet FILE`` for ``search`` and ``extract-many``: the tables of ``asyncsearch.arrow``.

A Parquet file can be read only once its footer is written, when it is closed. So a run writes
``FILE.partial`` (row groups as pages or results arrive) and, when it ends in any way the command
handles (done, Ctrl-C, SIGTERM, an error), closes it and renames it over ``FILE``. A resumed
``extract-many`` copies the rows of the ``FILE`` it finds into the new one first, then adds what
it fetches. A run killed outright (SIGKILL, power loss) leaves ``FILE`` as the last run left it
and only its ``.partial`` is lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import IO, Any

from asyncsearch import ExtractionResult

from ._run import CommandError

try:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from asyncsearch.arrow import EXTRACTION_SCHEMA, extraction_values, extractions_batch
except ImportError as exc:  # pragma: no cover - the message is the point
    raise CommandError(
        f"--parquet needs pyarrow: pip install 'asyncsearch[arrow]' ({exc.name or exc} is missing)"
    ) from exc

__all__ = ["ExtractionParquet", "HitParquet"]

#: Results per row group of ``extract-many``: small enough to keep little in memory.
ROWS_PER_GROUP = 1_000


class _PartialFile:
    """``FILE.partial``, locked, written by a ``ParquetWriter`` and renamed over ``FILE``."""

    def __init__(self, path: str) -> None:
        from ._export import _lock  # the JSON Lines export's lock: one run per output file

        self.path = path
        self.partial = path + ".partial"
        # Not "w": the file (another run's, or what a killed run left) is emptied only once
        # this run holds its lock; and not "a", whose tell() still reports the old size after
        # truncate().
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        self._handle: IO[bytes] = open(fd, "r+b")  # noqa: SIM115 - closed in close()
        try:
            _lock(self._handle, self.partial)
        except BaseException:
            self._handle.close()
            raise
        self._handle.truncate(0)
        self._handle.seek(0)
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._handle, batch.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self, schema: pa.Schema | None) -> None:
        """Finish the file (an empty one with ``schema`` if nothing was written) and move it
        over ``FILE``; without a schema and rows, remove it and leave ``FILE`` as it was."""
        try:
            if self._writer is None and schema is not None:
                self._writer = pq.ParquetWriter(self._handle, schema)
            if self._writer is not None:
                self._writer.close()
                self._handle.flush()
                os.fsync(self._handle.fileno())
                os.replace(self.partial, self.path)
            else:
                os.unlink(self.partial)
        finally:
            self._handle.close()


def _read_existing(path: str) -> Any:
    """The table an earlier run left in ``path``, or None when there is none."""
    if not os.path.exists(path):
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise CommandError(
            f"{path} is not a Parquet file this command can resume ({exc}); move it away or "
            "choose another --parquet file"
        ) from None
    if table.schema.names != EXTRACTION_SCHEMA.names:
        raise CommandError(
            f"{path} has the columns {table.schema.names}, not those of extract-many "
            f"({EXTRACTION_SCHEMA.names}); choose another --parquet file"
        )
    return table.cast(EXTRACTION_SCHEMA)


class ExtractionParquet:
    """The Parquet output of ``extract-many``: ``EXTRACTION_SCHEMA``, one row per id."""

    def __init__(self, path: str, *, retry_failed: bool, redact: Any) -> None:
        existing = _read_existing(path)
        self._redact = redact
        #: id -> whether its row is a success, as an earlier run left them.
        self.state: dict[str, bool] = {}
        self._file = _PartialFile(path)
        self._pending: list[tuple[str, tuple[str | None, str | None, str | None]]] = []
        if existing is not None:
            ok = existing.column("error").is_null().to_pylist()
            ids = existing.column("job_id").to_pylist()
            self.state = dict(zip(ids, ok, strict=True))
            # With --retry-failed, the failed rows are left out: their ids are fetched again,
            # so that every id is in the file once.
            keep = (
                existing
                if not retry_failed
                else existing.filter(existing.column("error").is_null())
            )
            for batch in keep.to_batches(ROWS_PER_GROUP):
                self._file.write(batch)

    def write(self, result: ExtractionResult) -> None:
        state, extraction, error = extraction_values(result.job, result.error)
        values = (state, extraction, None if error is None else self._redact(error))
        self._pending.append((str(result.job_id), values))
        if len(self._pending) >= ROWS_PER_GROUP:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            ids, values = zip(*self._pending, strict=True)
            self._file.write(extractions_batch(ids, values))
            self._pending.clear()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._file.close(EXTRACTION_SCHEMA)


class HitParquet:
    """The Parquet output of ``search``: the columns of ``asyncsearch.arrow.search_table``."""

    def __init__(self, path: str) -> None:
        self._file = _PartialFile(path)

    @property
    def rows(self) -> int:
        return self._file.rows

    def write(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self._file.write(batch)

    def close(self, schema: pa.Schema | None) -> None:
        self._file.close(schema)
