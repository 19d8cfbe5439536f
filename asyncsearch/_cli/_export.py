"""``asyncsearch extract-many``: a resumable export of extraction results to JSON Lines.

The output file is the only state. Each result is written as one line and flushed as soon as it
arrives, so a killed run loses at most the requests in flight; on start the file is read back
(only the ``jobId`` and ``ok`` of each line are decoded) to know what is done. Nothing is ever
rewritten: ``--retry-failed`` appends, and the last line of an id wins.
"""

from __future__ import annotations

import asyncio
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import msgspec
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from asyncsearch import (
    AuthenticationError,
    ExtractionFailure,
    ExtractionResult,
    InvalidRequestError,
)

from ._outputs import STDOUT, cannot_write, check_not_input, check_output
from ._render import stderr_console
from ._run import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError, Context, count

if sys.platform != "win32":
    import fcntl

__all__ = ["extract_many"]

#: After Ctrl-C or SIGTERM, how long the requests in flight may take before they are dropped.
GRACE_SECONDS = 15.0
CHUNK_SIZE = 64 * 1024
#: Without a terminal (a CI log, a container), a plain progress line this often on stderr: a
#: long run must not look hung, and a log should not get a line per result.
PROGRESS_SECONDS = 5.0
#: The first bytes of a Parquet file: an easy slip is ``-o FILE.parquet`` for ``--parquet``.
PARQUET_MAGIC = b"PAR1"


class _LineHead(msgspec.Struct, rename="camel"):
    """What resuming needs of an output line; the job itself is skipped without being decoded."""

    job_id: str
    ok: bool


_head_decoder = msgspec.json.Decoder(_LineHead)
_encoder = msgspec.json.Encoder()


@dataclass
class _Existing:
    """What an earlier run left in the output file."""

    state: dict[str, bool] = field(default_factory=dict)  # id -> ok of its last valid line
    lines: int = 0
    bad_lines: int = 0
    cut_bytes: int = 0  # a partial last line, cut off


#: What ``-o`` resumes, as the refusal of anything else says it.
JSON_LINES_EXPORT = "an export of extract-many (JSON Lines, one result per line)"
#: The longest first line read to recognise an export (a job's line is rarely over 1 MB).
FIRST_LINE_LIMIT = 16 * 1024 * 1024
#: How an export's lines start, as ``_encoder`` writes them: ``{"jobId":``.
LINE_START = b'{"jobId":'


def recognise_export(path: str) -> str | None:
    """None when ``path`` is empty or a JSON Lines export of extract-many; else why it is not.

    Only the first line decides: a line damaged later in a real export is reported and its id
    fetched again, but a file that starts with anything else (an app's log, a config, a list of
    ids, a CSV, a Parquet file) is not an export, and cutting or appending to it would harm it.
    """
    with open(path, "rb") as handle:
        if handle.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC:
            return "it is a Parquet file (--parquet writes and resumes those)"
        handle.seek(0)
        line = b""
        while not line.strip():
            line = handle.readline(FIRST_LINE_LIMIT)
            if not line:
                return None  # empty, or only blank lines: nothing to harm
    if not line.endswith(b"\n"):
        # Cut short by a kill in the middle of the first write, or too long to judge.
        if line.lstrip().startswith(LINE_START):
            return None
        return "its first line is not a line of extract-many"
    try:
        _head_decoder.decode(line)
    except msgspec.DecodeError:
        return 'its first line is not a line of extract-many (a JSON object with "jobId" and "ok")'
    return None


def _scan(handle: IO[bytes], name: str) -> _Existing:
    """Read back an output file, cut a partial last line off, and leave it ready to append.

    The file was recognised as an export by ``recognise_export`` (``check_output``).
    """
    found = _Existing()
    handle.seek(0)
    end = 0  # where the last complete line ends
    unterminated = False
    for line in handle:
        terminated = line.endswith(b"\n")
        if not line.strip():
            end += len(line)
            continue
        try:
            head = _head_decoder.decode(line)
        except msgspec.DecodeError:
            if not terminated:
                # A line cut short by a kill in the middle of a write (only ever the last one).
                found.cut_bytes = len(line)
                break
            found.bad_lines += 1
        else:
            found.state[head.job_id] = head.ok
            found.lines += 1
            # A complete line that only lacks its newline (an edited file) is kept.
            unterminated = not terminated
        end += len(line)
    if found.cut_bytes:
        handle.truncate(end)
    handle.seek(0, os.SEEK_END)
    if unterminated:
        handle.write(b"\n")
        handle.flush()
    return found


def _lock(handle: IO[bytes], name: str) -> None:
    """Refuse a second export writing to the same file, which would interleave their lines."""
    if sys.platform == "win32":
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise CommandError(
            f"{name} is being written by another extract-many; wait for it to finish",
            EXIT_USAGE,
        ) from None


def _open_output(name: str, *, replace: bool) -> tuple[IO[bytes], _Existing]:
    """The ``-o`` file, locked and read back; ``replace`` (--force): emptied instead."""
    try:
        if os.path.exists(name) and not os.path.isfile(name):
            # A pipe or a device (/dev/null): written like stdout, with nothing to read back or
            # protect (and a pipe cannot be opened for appending: it has no end to seek to).
            return open(name, "wb"), _Existing()
        handle = open(name, "a+b")  # noqa: SIM115 - closed by the caller when the run ends
    except OSError as exc:
        raise cannot_write(name, "--output", exc.strerror or str(exc)) from None
    try:
        _lock(handle, name)
        if replace and stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            # Emptied only once this run holds the lock, never under another run.
            handle.truncate(0)
            return handle, _Existing()
        return handle, _scan(handle, name)
    except BaseException:
        handle.close()
        raise


class _Chunks(Protocol):
    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class _FileChunks:
    """Chunks of a regular file, read in the event loop's thread: a local read is short."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    async def read(self) -> bytes:
        return self._handle.read(CHUNK_SIZE)

    def close(self) -> None:
        self._handle.close()


class _PipeChunks:
    """Chunks of a pipe or terminal (stdin), each read in a daemon thread when asked for.

    A slow producer then never blocks the event loop, and a read still waiting at exit never
    holds the process: the thread is a daemon, and ``os.read`` takes none of the locks of
    Python's buffered files, which a daemon thread blocked in ``sys.stdin.buffer.read`` would
    hold while the interpreter shuts down.
    """

    def __init__(self, fd: int, keep: object = None) -> None:
        self._fd = fd
        self._keep = keep  # the file object owning fd, kept open for as long as we may read
        self._requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[bytes]]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def read(self) -> bytes:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="asyncsearch ids reader", daemon=True
            )
            self._thread.start()
        self._requests.put((loop, future))
        return await future

    def _serve(self) -> None:
        while True:
            loop, future = self._requests.get()
            data = b""
            failure: OSError | None = None
            try:
                data = os.read(self._fd, CHUNK_SIZE)
            except OSError as exc:
                failure = exc
            try:
                loop.call_soon_threadsafe(_settle, future, data, failure)
            except RuntimeError:
                return  # the event loop is closed: nobody is waiting any more
            if not data:
                return

    def close(self) -> None:
        # Not closed while the thread may still read it; the process exit closes it.
        pass


def _settle(future: asyncio.Future[bytes], data: bytes, failure: OSError | None) -> None:
    if future.done():  # the reader was cancelled meanwhile
        return
    if failure is not None:
        future.set_exception(failure)
    else:
        future.set_result(data)


def _open_ids(name: str) -> tuple[_Chunks, bool]:
    """The ids input as chunks, and whether it is a regular file (whose size can be counted)."""
    if name == "-":
        return _PipeChunks(sys.stdin.fileno()), False
    try:
        handle = open(name, "rb")  # noqa: SIM115 - closed with the chunks
    except OSError as exc:
        raise CommandError(f"cannot read the ids: {exc}", EXIT_USAGE) from None
    if stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        return _FileChunks(handle), True
    return _PipeChunks(handle.fileno(), keep=handle), False


def _clean(raw: bytes) -> str | None:
    """The job id on a line of the input, or None for a blank line or a # comment.

    Raises ``UnicodeDecodeError`` for a line that is not UTF-8: its bytes are never replaced.
    """
    text = raw.decode("utf-8").strip().lstrip("\ufeff").strip()
    if not text or text.startswith("#"):
        return None
    return text


async def _lines(chunks: _Chunks) -> AsyncGenerator[bytes]:
    rest = b""
    while True:
        chunk = await chunks.read()
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            yield part
    if rest:
        yield rest


@dataclass
class _Export:
    """The state of one run: what is done, what was read, what is in flight."""

    done: dict[str, bool]
    retry_failed: bool
    seen: set[str] = field(default_factory=set)
    duplicates: int = 0
    skipped_ok: int = 0
    skipped_failed: int = 0
    fetched_ok: int = 0
    fetched_failed: int = 0
    in_flight: int = 0  # ids handed to the fetcher whose result has not been written yet
    stopping: bool = False
    #: Writes the failure of a line that is not UTF-8 (never sent); set by the run.
    refuse: Callable[[ExtractionResult], None] | None = None
    lines_read: int = 0

    def wanted(self, job_id: str) -> bool:
        """Whether to fetch ``job_id``, counting it as a duplicate or as already done if not."""
        if job_id in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(job_id)
        previous = self.done.get(job_id)
        if previous is True:
            self.skipped_ok += 1
            return False
        if previous is False and not self.retry_failed:
            self.skipped_failed += 1
            return False
        return True

    async def pending(self, chunks: _Chunks) -> AsyncIterator[str]:
        """The ids to fetch, read lazily; ends early once the run is stopping."""
        async with aclosing(_lines(chunks)) as lines:
            async for raw in lines:
                if self.stopping:
                    return
                self.lines_read += 1
                try:
                    job_id = _clean(raw)
                except UnicodeDecodeError as exc:
                    self._refuse(raw, exc)
                    continue
                if job_id is None or not self.wanted(job_id):
                    continue
                self.in_flight += 1
                yield job_id

    def _refuse(self, raw: bytes, exc: UnicodeDecodeError) -> None:
        """A line that is not UTF-8: a failed id, shown with its bytes escaped, never sent."""
        shown = raw.decode("utf-8", "backslashreplace").strip()
        if not self.wanted(shown):
            return
        error = InvalidRequestError(
            f"line {self.lines_read} of the ids is not UTF-8 ({exc.reason} at byte {exc.start}): "
            "not sent"
        )
        assert self.refuse is not None
        self.refuse(ExtractionFailure(job_id=shown, error=error))
        self.fetched_failed += 1

    @property
    def fetched(self) -> int:
        return self.fetched_ok + self.fetched_failed

    @property
    def failed(self) -> int:
        return self.fetched_failed + self.skipped_failed


def _count_pending(name: str, done: dict[str, bool], retry_failed: bool) -> int:
    """How many ids a run will fetch, for the progress bar's total (one quick extra read)."""
    counter = _Export(done=done, retry_failed=retry_failed)
    with open(name, "rb") as handle:
        found = 0
        for raw in handle:
            with suppress(UnicodeDecodeError):  # not fetched: reported by the run itself
                job_id = _clean(raw)
                found += bool(job_id and counter.wanted(job_id))
        return found


def _line(result: ExtractionResult, ctx: Context) -> bytes:
    job_id = str(result.job_id)
    if result.error is None:
        return _encoder.encode({"jobId": job_id, "ok": True, "job": result.job}) + b"\n"
    failure = result.error
    body: dict[str, Any] = {
        "jobId": job_id,
        "ok": False,
        "error": {
            "type": type(failure).__name__,
            "message": ctx.redact(str(failure)),
            "status": getattr(failure, "status_code", None),
        },
    }
    return _encoder.encode(body) + b"\n"


class _ProgressLines:
    """Progress for a log: a plain line on stderr every ``PROGRESS_SECONDS`` until stopped."""

    def __init__(self, export: _Export, total: int | None, started: float) -> None:
        self._export = export
        self._total = total
        self._started = started
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(PROGRESS_SECONDS, self._tick)

    def _tick(self) -> None:
        export = self._export
        of = "" if self._total is None else f" of {self._total}"
        elapsed = time.monotonic() - self._started
        print(
            f"extract-many: {export.fetched}{of} fetched so far ({export.fetched_failed} failed, "
            f"{export.in_flight} in flight) after {elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        self.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _progress(total: int | None, *, shown: bool) -> Progress:
    """The progress bar; ``shown`` False (--quiet, or no terminal) keeps it off the screen."""
    console = stderr_console()
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[red]{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (shown and console.is_terminal),
    )


def _summary(
    export: _Export, output: str, elapsed: float, *, stopped: str | None, parquet: bool = False
) -> str:
    """The closing report; ``stopped`` says why a run that did not finish ended early."""
    rate = f", {export.fetched / elapsed:.0f}/s" if elapsed > 0 and export.fetched else ""
    if stopped is not None:
        return (
            f"extract-many: {stopped} after fetching {count(export.fetched, 'id')} "
            f"({export.fetched_ok} ok, {export.fetched_failed} failed) in {elapsed:.1f} s; "
            "run the same command again to resume"
        )
    details = [f"fetched {export.fetched} in {elapsed:.1f} s{rate}" if export.fetched else ""]
    earlier = export.skipped_ok + export.skipped_failed
    if earlier:
        details.append(f"{earlier} already in {output}")
    if export.duplicates:
        details.append(f"{count(export.duplicates, 'repeated id')} ignored")
    ok = export.fetched_ok + export.skipped_ok
    line = (
        f"extract-many: {count(len(export.seen), 'id')}, {ok} ok, {export.failed} failed "
        f"({'; '.join(d for d in details if d) or 'nothing to fetch'})"
    )
    if export.failed:
        kept = f" ({export.skipped_failed} from an earlier run)" if export.skipped_failed else ""
        where = "the rows with an error" if parquet else 'the lines with "ok": false'
        line += (
            f"\nextract-many: {count(export.failed, 'id')} failed{kept}: see {where}; "
            "--retry-failed fetches them again"
        )
    return line


async def extract_many(ctx: Context) -> int:
    """``asyncsearch extract-many``: fetch many jobs into a resumable JSON Lines file."""
    args = ctx.args
    client = ctx.client()  # a missing key or URL is reported before any file is touched
    if args.parquet is not None:
        check_not_input(args.ids, "IDS", args.parquet, "--parquet")
        from ._parquet import PARQUET_EXPORT, recognise_parquet_export

        check_output(
            args.parquet,
            "--parquet",
            force=args.force,
            renamed=True,
            export=PARQUET_EXPORT,
            recognise=recognise_parquet_export,
        )
    else:
        check_not_input(args.ids, "IDS", args.output, "--output")
        check_output(
            args.output,
            "--output",
            force=args.force,
            export=JSON_LINES_EXPORT,
            recognise=recognise_export,
        )
    chunks, countable = _open_ids(args.ids)
    out: IO[bytes] | None = None
    parquet = None
    if args.parquet is not None:
        try:
            from ._parquet import ExtractionParquet

            parquet = ExtractionParquet(args.parquet, redact=ctx.redact, replace=args.force)
        except BaseException:
            chunks.close()
            raise
        existing = _Existing(state=parquet.state, lines=len(parquet.state))
    elif args.output == STDOUT:
        out, existing = sys.stdout.buffer, _Existing()
    else:
        try:
            out, existing = _open_output(args.output, replace=args.force)
        except BaseException:
            chunks.close()
            raise
    output_name = args.parquet if parquet is not None else args.output
    export = _Export(done=existing.state, retry_failed=args.retry_failed)
    total = None
    terminal = stderr_console().is_terminal
    if countable and not args.quiet:
        total = _count_pending(args.ids, existing.state, args.retry_failed)
    progress = _progress(total, shown=not args.quiet)
    say = progress.console.print
    if existing.cut_bytes:
        say(
            f"extract-many: cut off a partial last line ({count(existing.cut_bytes, 'byte')}) "
            "left by an "
            "interrupted run",
            markup=False,
            soft_wrap=True,
        )
    if existing.bad_lines:
        say(
            f"extract-many: {count(existing.bad_lines, 'line')} of {args.output} "
            f"{'is' if existing.bad_lines == 1 else 'are'} not a line of extract-many (not "
            'JSON, or no "jobId" and "ok"); ignored, and any ids they hold fetched again',
            markup=False,
            soft_wrap=True,
        )

    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []

    def on_signal(signum: int) -> bool:
        export.stopping = True
        if export.in_flight == 0:
            return False  # nothing to wait for: stop at once
        say(
            f"extract-many: stopping; writing the {count(export.in_flight, 'result')} in flight "
            f"(up to {GRACE_SECONDS:.0f} s; press Ctrl-C again to stop now)",
            markup=False,
            soft_wrap=True,
        )
        timers.append(loop.call_later(GRACE_SECONDS, ctx.runtime.cancel))
        return True

    ctx.runtime.on_signal = on_signal

    def write(result: ExtractionResult) -> None:
        if parquet is not None:
            parquet.write(result)
        else:
            assert out is not None
            out.write(_line(result, ctx))
            out.flush()

    export.refuse = write  # a line of ids refused before it is sent: written as any result
    started = time.monotonic()
    task = progress.add_task("fetching", total=total, failed=0)
    lines = None if args.quiet or terminal else _ProgressLines(export, total, started)
    finished = False
    try:
        if lines is not None:
            lines.start()
        with progress:
            async with (
                client,
                client.iter_extractions(
                    export.pending(chunks), concurrency=args.concurrency, format=args.format
                ) as results,
            ):
                async for result in results:
                    export.in_flight -= 1
                    if isinstance(result.error, AuthenticationError):
                        # Every other id would fail the same way: stop, and record nothing.
                        raise result.error
                    write(result)
                    if result.ok:
                        export.fetched_ok += 1
                    else:
                        export.fetched_failed += 1
                    progress.update(task, advance=1, failed=export.fetched_failed)
                    if export.stopping and export.in_flight == 0:
                        break
        finished = not export.stopping
    finally:
        if lines is not None:
            lines.stop()
        for timer in timers:
            timer.cancel()
        chunks.close()
        if parquet is not None:
            parquet.close()  # what was fetched is kept, however the run ended
        elif out is not None and out is not sys.stdout.buffer:
            out.close()
        stopped = None
        if not finished:
            stopped = "interrupted" if ctx.runtime.signal is not None else "stopped"
        elapsed = time.monotonic() - started
        summary = _summary(
            export, output_name, elapsed, stopped=stopped, parquet=parquet is not None
        )
        print(summary, file=sys.stderr, flush=True)
    if not finished:
        return ctx.runtime.exit_code
    return EXIT_FAILURE if export.failed else EXIT_OK
