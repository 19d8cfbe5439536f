"""``--parquet FILE`` for ``search`` and ``extract-many``: the tables of ``asyncsearch.arrow``.

A Parquet file can be read only once its footer is written, when it is closed; so neither
command ever writes into ``FILE`` itself: a new ``FILE`` is written aside, fsynced and renamed
over it, and a reader sees the old file or the new one, never half of one.

``search --parquet FILE`` writes ``FILE.partial`` and, when the walk ends in any way the command
handles (done, Ctrl-C, SIGTERM, an error), closes it and renames it over ``FILE``. An existing
``FILE.partial`` is taken over only when it is empty or starts as a Parquet file (a killed
search's); anything else is refused and left as it is. A search killed
outright (SIGKILL, power loss) leaves ``FILE`` as it was; run it again, or resume with ``--page``.

``extract-many --parquet FILE`` survives ``kill -9``: every ``FLUSH_ROWS`` results are written as
one finished part file, ``FILE.parts/NNNNNNNN.parquet``, each a complete Parquet file written
under a temporary name (``.tmp``), fsynced, and atomically renamed, so a part either is whole or
does not exist under its final name. When the run ends in any way the command handles, ``FILE``
and the parts are merged into a new ``FILE`` (written aside, fsynced, renamed over it) and the
parts removed. A run resumed after any end, ``kill -9`` included, takes the ids done from
``FILE`` and from the finished parts (a leftover ``.tmp`` is an unfinished part: removed, its ids
fetched again), so a kill loses only the results not yet in a finished part: at most
``FLUSH_ROWS`` and the requests in flight. Of the rows of an id (``FILE`` first, then the parts in
the order written) the last one wins, in the run's state and in the merge, so the final ``FILE``
has every id once; also after a kill between renaming the merged file and removing the parts,
or after ``--retry-failed`` added a new row for an id that had failed. ``FILE.parts/lock`` is
held (``flock``) by the run, so a second run on the same ``FILE`` is refused.

Row groups: a final file (``FILE`` of either command) is written in row groups of at least
``ROWS_PER_GROUP`` rows (the last one smaller), or fewer once they hold ``MAX_GROUP_BYTES`` in
memory (wide embeddings): few enough for a reader to plan around, and large enough to compress
and scan well. A part is flushed after ``FLUSH_ROWS`` results, the
trade-off being what a kill may lose, not how the file reads: parts are merged into
``ROWS_PER_GROUP`` row groups at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable
from typing import IO, Any

from asyncsearch import ExtractionResult
from asyncsearch._errors import install_hint

from ._outputs import cannot_write
from ._run import EXIT_USAGE, CommandError

try:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from asyncsearch.arrow import EXTRACTION_SCHEMA, extraction_values, extractions_batch
except ImportError as exc:  # pragma: no cover - the message is the point
    raise CommandError(
        f"--parquet needs pyarrow: {install_hint('arrow')} ({exc.name or exc} is missing)"
    ) from exc

__all__ = [
    "FLUSH_ROWS",
    "PARQUET_EXPORT",
    "ROWS_PER_GROUP",
    "ExtractionParquet",
    "HitParquet",
    "recognise_parquet_export",
]

#: Rows per row group of a finished file (at least; the last group holds the rest).
ROWS_PER_GROUP = 16_384
#: ...or fewer rows once they hold this many bytes in memory: 16,384 hits with both embeddings
#: (512 + 768 float32) are about 84 MB, and a row group is held whole until it is written.
MAX_GROUP_BYTES = 64 * 1024 * 1024
#: Results of ``extract-many`` per finished part file: at most what a ``kill -9`` loses.
FLUSH_ROWS = 1_000

_PARQUET_MAGIC = b"PAR1"  # the first bytes of a Parquet file
_PART_NAME = re.compile(r"^(\d{8})\.parquet$")
_TEMPORARY = ".tmp"
_LOCK_NAME = "lock"


def _fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _GroupedWriter:
    """A ``ParquetWriter`` on ``handle`` that gathers batches into row groups of at least
    ``rows_per_group`` rows, or of ``max_group_bytes`` bytes held, whichever comes first."""

    def __init__(
        self,
        handle: IO[bytes],
        rows_per_group: int = ROWS_PER_GROUP,
        max_group_bytes: int = MAX_GROUP_BYTES,
    ) -> None:
        self._handle = handle
        self._rows_per_group = rows_per_group
        self._max_group_bytes = max_group_bytes
        self._writer: pq.ParquetWriter | None = None
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0
        self._held_bytes = 0
        self.rows = 0
        self.row_groups = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._held.append(batch)
        self._held_rows += batch.num_rows
        self._held_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._held_rows >= self._rows_per_group or self._held_bytes >= self._max_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        table = pa.Table.from_batches(self._held)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._handle, table.schema)
        # One row group for everything held, however many pages or results it came from.
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.row_groups += 1
        self._held.clear()
        self._held_rows = 0
        self._held_bytes = 0

    @property
    def started(self) -> bool:
        """Whether anything was written or is held."""
        return self._writer is not None or bool(self._held)

    def close(self, schema: pa.Schema | None) -> None:
        """Write what is held and the footer; with nothing written, an empty file of ``schema``."""
        self._flush()
        if self._writer is None:
            assert schema is not None
            self._writer = pq.ParquetWriter(self._handle, schema)
        self._writer.close()
        self._handle.flush()
        os.fsync(self._handle.fileno())


class _PartialFile:
    """``FILE.partial``, locked, written in row groups and renamed over ``FILE``."""

    def __init__(self, path: str) -> None:
        from ._export import _lock  # the JSON Lines export's lock: one run per output file

        self.path = path
        self.partial = path + ".partial"
        # Not "w": the file (another run's, or what a killed run left) is emptied only once
        # this run holds its lock; and not "a", whose tell() still reports the old size after
        # truncate().
        try:
            fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            # Name the file that could not be made: FILE itself may well exist (/proc/version).
            raise cannot_write(
                path,
                "--parquet",
                f"cannot create {self.partial}, where it is written before being renamed "
                f"into place: {exc.strerror or exc}",
            ) from None
        self._handle: IO[bytes] = open(fd, "r+b")  # noqa: SIM115 - closed in close()
        try:
            _lock(self._handle, self.partial)
            self._check_own()
        except BaseException:
            self._handle.close()
            raise
        self._handle.truncate(0)
        self._handle.seek(0)
        self._writer = _GroupedWriter(self._handle)

    def _check_own(self) -> None:
        """Refuse to empty a ``FILE.partial`` that is not one a search was writing (empty, or
        the start of a Parquet file): no command writes over a file it did not make."""
        head = self._handle.read(len(_PARQUET_MAGIC))
        if head and head != _PARQUET_MAGIC:
            raise CommandError(
                f"{self.partial} (beside --parquet {self.path}, where the file is written before "
                "being renamed into place) exists and is not a Parquet file a search was "
                "writing; it is left as it is. Move it away, or choose another --parquet file",
                EXIT_USAGE,
            )

    @property
    def rows(self) -> int:
        return self._writer.rows

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write(batch)

    def close(self, schema: pa.Schema | None) -> None:
        """Finish the file (an empty one with ``schema`` if nothing was written) and move it
        over ``FILE``; without a schema and rows, remove it and leave ``FILE`` as it was."""
        try:
            if self._writer.started or schema is not None:
                self._writer.close(schema)
                os.replace(self.partial, self.path)
                _fsync_folder(os.path.dirname(os.path.abspath(self.path)))
            else:
                os.unlink(self.partial)
        finally:
            self._handle.close()


#: What ``extract-many --parquet`` resumes, as the refusal of anything else says it.
PARQUET_EXPORT = "a Parquet export of extract-many"


def recognise_parquet_export(path: str) -> str | None:
    """None when ``path`` (FILE or one of its parts) is a Parquet file of ``extract-many``;
    else why it is not."""
    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowInvalid) as exc:
        return f"it cannot be read as Parquet ({exc})"
    if names != EXTRACTION_SCHEMA.names:
        return f"it has the columns {names}, not those of extract-many {EXTRACTION_SCHEMA.names}"
    return None


def _check_part(part: str, path: str) -> None:
    """Refuse to resume from a finished part of ``path`` that is not one (FILE itself was
    recognised by ``check_output`` before the run started)."""
    why = recognise_parquet_export(part)
    if why is not None:
        raise CommandError(
            f"{part}, a finished part of {path}, is not a part of extract-many ({why}); remove "
            "it to fetch its ids again"
        )


class _PartsFolder:
    """``FILE.parts/``: the finished parts of ``extract-many``, and the lock of the run."""

    def __init__(self, path: str) -> None:
        from ._export import _lock  # the JSON Lines export's lock: one run per output file

        self.path = path
        self.folder = path + ".parts"
        lock_path = os.path.join(self.folder, _LOCK_NAME)
        for _ in range(10):
            try:
                # Not makedirs: a missing folder of FILE is the user's slip, never made here.
                os.mkdir(self.folder)
            except FileExistsError:
                pass
            except OSError as exc:
                raise cannot_write(path, "--parquet", exc.strerror or str(exc)) from None
            try:
                handle = open(lock_path, "a+b")  # noqa: SIM115 - closed in release()
            except FileNotFoundError:
                continue  # the folder was just removed by a run that ended: make it again
            except OSError as exc:
                raise cannot_write(path, "--parquet", exc.strerror or str(exc)) from None
            _lock(handle, path)
            try:
                held = os.fstat(handle.fileno())
                current = os.stat(lock_path)
            except FileNotFoundError:
                handle.close()
                continue
            if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
                self._lock = handle
                break
            handle.close()  # a run that ended removed this lock file meanwhile: take the new one
        else:  # pragma: no cover - ten runs ending in a row while this one starts
            raise CommandError(f"could not lock {lock_path}; try again")

    def finished(self) -> list[str]:
        """The finished parts, in the order they were written."""
        names = sorted(name for name in os.listdir(self.folder) if _PART_NAME.match(name))
        return [os.path.join(self.folder, name) for name in names]

    def remove_unfinished(self) -> None:
        """Remove the parts a killed run did not finish (their ids are fetched again)."""
        for name in os.listdir(self.folder):
            if name.endswith(_TEMPORARY):
                os.unlink(os.path.join(self.folder, name))

    def next_number(self) -> int:
        numbers = [_PART_NAME.match(os.path.basename(part)) for part in self.finished()]
        return max((int(m.group(1)) for m in numbers if m), default=0) + 1

    def write(self, number: int, table: pa.Table) -> None:
        """Write a finished part: aside, fsynced, then renamed into place."""
        final = os.path.join(self.folder, f"{number:08d}.parquet")
        temporary = final + _TEMPORARY
        with open(temporary, "wb") as handle:
            pq.write_table(table, handle, row_group_size=max(table.num_rows, 1))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        _fsync_folder(self.folder)

    def release(self) -> None:
        """Remove the lock and, when no part is left, the folder; then unlock."""
        try:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, _LOCK_NAME))
                # Fails when parts are left (a failed merge): the folder is kept with them.
                os.rmdir(self.folder)
        finally:
            self._lock.close()


def _merge(sources: list[str], path: str, temporary: str) -> None:
    """Write the last row of each id of ``sources`` (in order) to ``path``, via ``temporary``."""
    last: dict[Any, tuple[int, int]] = {}
    for index, source in enumerate(sources):
        ids = pq.read_table(source, columns=["job_id"]).column("job_id").to_pylist()
        for row, job_id in enumerate(ids):
            last[job_id] = (index, row)
    with open(temporary, "wb") as handle:
        writer = _GroupedWriter(handle)
        for index, source in enumerate(sources):
            offset = 0
            for batch in pq.ParquetFile(source).iter_batches(batch_size=ROWS_PER_GROUP):
                ids = batch.column("job_id").to_pylist()
                keep = [last[job_id] == (index, offset + row) for row, job_id in enumerate(ids)]
                offset += batch.num_rows
                if not all(keep):
                    batch = batch.filter(pa.array(keep, pa.bool_()))
                writer.write(batch.cast(EXTRACTION_SCHEMA))
        writer.close(EXTRACTION_SCHEMA)
    os.replace(temporary, path)
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


class ExtractionParquet:
    """The Parquet output of ``extract-many``: ``EXTRACTION_SCHEMA``, one row per id."""

    def __init__(self, path: str, *, redact: Callable[[str], str], replace: bool = False) -> None:
        # --retry-failed needs nothing here: a failed id fetched again gets a later row, which
        # wins over the failed one in the merge.
        self.path = path
        self._redact = redact
        #: --force: FILE and the parts of an earlier run are not read, and replaced at the end.
        self._replace = replace
        self._parts = _PartsFolder(path)
        try:
            if replace:
                for part in self._parts.finished():
                    os.unlink(part)
            sources = [path] if self._resumes() else []
            sources += self._parts.finished()
            #: id -> whether its last row is a success, in FILE and the finished parts.
            self.state: dict[str, bool] = {}
            for source in sources:
                if source != path:
                    _check_part(source, path)
                table = pq.read_table(source, columns=["job_id", "error"])
                ids = table.column("job_id").to_pylist()
                ok = table.column("error").is_null().to_pylist()
                self.state.update(zip(ids, ok, strict=True))
            self._parts.remove_unfinished()
            self._next_part = self._parts.next_number()
        except BaseException:
            self._parts.release()
            raise
        self._pending: list[tuple[str, tuple[str | None, str | None, str | None]]] = []

    def write(self, result: ExtractionResult) -> None:
        state, extraction, error = extraction_values(result.job, result.error)
        values = (state, extraction, None if error is None else self._redact(error))
        self._pending.append((str(result.job_id), values))
        if len(self._pending) >= FLUSH_ROWS:
            self.flush()

    def _resumes(self) -> bool:
        """Whether FILE holds rows of this export (an earlier run's), merged with the new ones."""
        return not self._replace and os.path.exists(self.path)

    def flush(self) -> None:
        """Write the results held as a finished part."""
        if self._pending:
            ids, values = zip(*self._pending, strict=True)
            batch = extractions_batch(ids, values)
            self._parts.write(self._next_part, pa.Table.from_batches([batch]))
            self._next_part += 1
            self._pending.clear()

    def close(self) -> None:
        """Write what is held, merge ``FILE`` and the parts into ``FILE``, remove the parts."""
        try:
            self.flush()
            parts = self._parts.finished()
            if parts or not self._resumes():
                sources = ([self.path] if self._resumes() else []) + parts
                temporary = os.path.join(self._parts.folder, "merged.parquet" + _TEMPORARY)
                _merge(sources, self.path, temporary)
                for part in parts:
                    os.unlink(part)
        finally:
            self._parts.release()


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
