"""The ``asyncsearch`` command: search, read extraction results, export them, run the emulator.

``main(argv)`` is the console script and ``python -m asyncsearch``. This module and ``_run`` use
only the standard library and the public API, so ``--help`` is quick and works without the
``cli`` extra; rich and the emulator are imported by the command modules, loaded on first use.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import logging
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import TypeVar, get_args

from asyncsearch import ExtractionFormat, LinkType, Sort, __version__
from asyncsearch._errors import install_hint

from ._run import (
    ENV_API_KEY,
    ENV_BASE_URL,
    EXIT_SIGINT,
    EXIT_USAGE,
    PROG,
    Command,
    error,
    run_command,
    speak_flags,
)

__all__ = ["main"]

INSTALL_HINT = f"{PROG}: the command line needs the 'cli' extra (rich): {install_hint('cli')}"

EXIT_STATUS_HELP = """\
exit status:
  0    success
  1    the service or the network failed: an error answer, not found, the API key refused,
       or (extract-many) some ids failed
  2    bad arguments or configuration: a missing API key or URL, an invalid id, rich not
       installed
  130  interrupted by Ctrl-C (SIGINT); 143 stopped by SIGTERM
"""

ENVIRONMENT_HELP = f"""\
environment:
  {ENV_API_KEY}    the API key (prefer it to --api-key, which other users can see in `ps`)
  {ENV_BASE_URL}   the service's URL, e.g. https://search.example.com
"""

EXTRACT_MANY_HELP = """\
Fetch many extraction results concurrently and write one JSON line per job id to --output, each
written and flushed as it arrives.

Input: one job id per line, from the file IDS or from stdin (-); blank lines and lines starting
with # are ignored, and an id given more than once is fetched once. Ids are read as they are
needed, so any number of them works.

Output lines (JSON Lines, UTF-8):
  {"jobId": "<id>", "ok": true, "job": {<the job in its wire form>}}
  {"jobId": "<id>", "ok": false, "error": {"type": "NotFoundError", "message": "...",
   "status": 404}}
"status" is null for failures without an HTTP answer (an invalid id, a connection error).
A 401 (API key refused) stops the run and writes nothing for it.

Resuming: run the same command again on the same --output file and only what is missing is
fetched. An id that has a success line is never fetched again. An id whose line is a failure is
skipped too, unless --retry-failed is given: then it is fetched again and the new line is
APPENDED. Nothing is ever rewritten, so a reader must take the LAST line of each id. A partial
last line left by a killed run is cut off before anything is appended; lines that do not parse
are counted on stderr, ignored, and their ids fetched again. Keep the same options when
resuming. --output - writes to stdout and cannot be resumed.

--parquet FILE writes a Parquet file instead (the table of asyncsearch.arrow.extractions_table:
job_id, state, extraction as JSON text, error; needs pyarrow). It survives kill -9: every 1,000
results are written as a finished part, FILE.parts/NNNNNNNN.parquet (fsynced, renamed into
place); when the run ends in any way it handles (done, Ctrl-C, an error), FILE and the parts are
merged into FILE (row groups of 16,384 rows) and the parts removed. Resuming reads the ids done
from FILE and the finished parts and fetches only the others; with --retry-failed a failed id's
new row replaces the failed one, so every id is in the file once.

No command writes over a file it did not make: the output is never the input (IDS, also through
a link); an existing -o file is resumed only when it is empty or an export of extract-many (its
first line has "jobId" and "ok"), and an existing --parquet file only when it has the columns of
one; anything else is refused (exit 2) and left as it is. --force replaces the file instead and
starts a new export. An output that cannot be written is a usage error (exit 2).

Progress: a bar on a terminal; otherwise a plain line on stderr every 5 seconds. --quiet turns
both off (the summary is still printed).

Ctrl-C (or SIGTERM): no new request is started, the requests in flight are awaited and written
(for up to 15 seconds; Ctrl-C again stops at once), a summary is printed, and the exit status is
130 (143 for SIGTERM). Exit status 0 means every id has a success line; 1 means some failed,
including failures kept from an earlier run.
"""


N = TypeVar("N", int, float)


def _number(
    parse: Callable[[str], N], accept: Callable[[N], bool], kind: str, rule: str
) -> Callable[[str], N]:
    """An argparse ``type=`` that parses ``kind`` and refuses values failing ``accept``."""

    def convert(text: str) -> N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {kind}: {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return value

    return convert


_positive_int = _number(int, lambda v: v >= 1, "an integer", "must be at least 1")
_non_negative_int = _number(int, lambda v: v >= 0, "an integer", "must not be negative")
_port = _number(int, lambda v: 0 <= v <= 65535, "a port number", "not a port number")
_positive_float = _number(
    float, lambda v: 0 < v < float("inf"), "a number", "must be a positive number of seconds"
)


def _given(text: str) -> str:
    """An argparse ``type=`` for text options: an empty value is a slip (an unset shell
    variable), never a request to fall back to the environment or a default."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


FORCE_HELP = (
    "replace an existing output file that this command would otherwise refuse (any file it "
    "does not resume); without it, no command writes over a file it did not make"
)


def _timestamp(text: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 timestamp: {text!r} (e.g. 2024-01-31T00:00:00Z)"
        ) from None
    if value.tzinfo is None:
        # The library refuses naive datetimes as ambiguous; so does its command line.
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset; add Z or +hh:mm (e.g. {value.isoformat()}Z)"
        )
    return value


def _sort(text: str) -> Sort:
    field, colon, order = text.partition(":")
    if not field.strip() or (colon and not order.strip()):
        raise argparse.ArgumentTypeError(f"expected FIELD or FIELD:ORDER, got {text!r}")
    return Sort(field=field.strip(), order=order.strip() or None)


def _client_options(*, suppress: bool) -> argparse.ArgumentParser:
    """The options of every command that talks to the service.

    They are accepted before and after the command name; after it they are added with
    SUPPRESS defaults, so that leaving them out there keeps what was given before it.
    Not given at all, each is None (False for --allow-http).
    """
    parser = argparse.ArgumentParser(
        add_help=False, argument_default=argparse.SUPPRESS if suppress else None
    )
    group = parser.add_argument_group("service options")
    group.add_argument(
        "--api-key",
        type=_given,
        metavar="KEY",
        help=f"the API key (default: env {ENV_API_KEY}); never printed",
    )
    group.add_argument(
        "--base-url",
        type=_given,
        metavar="URL",
        help=f"the service's URL (default: env {ENV_BASE_URL})",
    )
    group.add_argument("--base-id", type=_given, metavar="ID", help="run against this base")
    group.add_argument(
        "--allow-http",
        action="store_true",
        help="allow plain http:// to a host that is not loopback (the key travels unencrypted)",
    )
    group.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="total time per attempt (default: connect 10 s, read 60 s, total 180 s)",
    )
    group.add_argument(
        "--max-retries",
        type=_non_negative_int,
        metavar="N",
        help="retries after the first attempt (default: 2)",
    )
    group.add_argument(
        "-v", "--verbose", action="count", help="log retries (-v) or every request (-vv) on stderr"
    )
    return parser


def _subcommand(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str | None = None,
    service: bool = True,
) -> argparse.ArgumentParser:
    """A command's parser; one that talks to the service takes the service options too."""
    return commands.add_parser(
        name,
        help=help,
        description=description or help,
        parents=[_client_options(suppress=True)] if service else [],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``asyncsearch`` command."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Search content, read extraction results and webhook logs, export many extraction\n"
            "results, or run a local emulator of the service."
        ),
        epilog=ENVIRONMENT_HELP
        + "\n"
        + EXIT_STATUS_HELP
        + f"\nTry it without an account: '{PROG} demo', or '{PROG} serve' in one terminal.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_client_options(suppress=False)],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    search = _subcommand(
        commands,
        "search",
        help="search by text, image or similar resource, with filters",
        description=(
            "Search and print the best hits as a table, or with --json one JSON line per hit in "
            "the wire form (for pipes). Several pages are walked as needed for --max-items."
        ),
    )
    search.add_argument("text", nargs="?", help="the text to search for")
    query = search.add_argument_group("query")
    query.add_argument("--image", type=_given, metavar="PATH", help="search by this image file")
    query.add_argument(
        "--resource-id", type=_given, metavar="ID", help="search resources similar to this one"
    )
    query.add_argument("--precision", type=float, help="from 0 to 1: how close hits must be")
    query.add_argument(
        "--incognito", action="store_true", help="do not keep this search in the history"
    )
    filters = search.add_argument_group("filters (repeat a flag for any of several values)")
    filters.add_argument("--kind", action="append", type=_given, dest="kinds", metavar="KIND")
    filters.add_argument("--color", action="append", type=int, metavar="N", help="label id")
    filters.add_argument(
        "--parent-id", action="append", type=_given, dest="parent_ids", metavar="ID"
    )
    filters.add_argument(
        "--ancestor-id", action="append", type=_given, dest="ancestor_ids", metavar="ID"
    )
    filters.add_argument("--tag-id", action="append", type=_given, dest="tag_ids", metavar="ID")
    filters.add_argument("--user-id", action="append", type=_given, dest="user_ids", metavar="ID")
    filters.add_argument(
        "--created-after", type=_timestamp, metavar="TIME", help="ISO 8601 with offset or Z"
    )
    filters.add_argument(
        "--created-before", type=_timestamp, metavar="TIME", help="ISO 8601 with offset or Z"
    )
    results = search.add_argument_group("results")
    results.add_argument(
        "--sort", type=_sort, metavar="FIELD[:ORDER]", help="e.g. createdAt:desc or name"
    )
    results.add_argument(
        "--page",
        type=int,
        metavar="N",
        help="the page to start from (default: the first, 1); resumes an earlier listing",
    )
    results.add_argument(
        "--page-size",
        type=_positive_int,
        metavar="N",
        help="hits per request (default: min(--max-items, 100))",
    )
    results.add_argument(
        "--max-items",
        type=_positive_int,
        default=None,
        metavar="N",
        help="hits to show (default: 20; with --parquet, every hit)",
    )
    formats = results.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="one JSON line per hit")
    formats.add_argument(
        "--parquet",
        type=_given,
        metavar="FILE",
        help=(
            "write the hits to a Parquet file (the columns of asyncsearch.arrow.search_table, "
            "embeddings included; every hit unless --max-items), needs pyarrow (the arrow extra)"
        ),
    )
    results.add_argument("--force", action="store_true", help=FORCE_HELP)

    extract = _subcommand(
        commands,
        "extract",
        help="print one extraction job",
        description=(
            "Print an extraction job as indented JSON, or with --format markdown the Markdown "
            "rendering of its caption. --json prints the job as one JSON line."
        ),
    )
    extract.add_argument("job_id", metavar="JOB_ID")
    extract.add_argument("--format", choices=get_args(ExtractionFormat), default=None)
    extract.add_argument("--json", action="store_true", help="the job as one JSON line")

    link = _subcommand(commands, "link", help="print the link preview of a URL")
    link.add_argument("url", metavar="URL")
    link.add_argument(
        "--type", choices=get_args(LinkType), default=None, help="cache (default) or link: re-read"
    )
    link.add_argument("--json", action="store_true", help="the preview as one JSON line")

    webhook_logs = _subcommand(
        commands,
        "webhook-logs",
        help="list the webhook deliveries of a job, or show one",
        description=(
            "With JOB_ID only, a table of the job's webhook deliveries (--json: one JSON line "
            "each); with LOG_ID too, that delivery in full as JSON."
        ),
    )
    webhook_logs.add_argument("job_id", metavar="JOB_ID")
    webhook_logs.add_argument("log_id", metavar="LOG_ID", nargs="?")
    webhook_logs.add_argument("--json", action="store_true", help="JSON lines instead of a table")

    many = _subcommand(
        commands,
        "extract-many",
        help="export many extraction results to a resumable JSON Lines file",
        description=EXTRACT_MANY_HELP,
    )
    many.add_argument(
        "ids", type=_given, metavar="IDS", help="a file of job ids, one per line, or - for stdin"
    )
    outputs = many.add_mutually_exclusive_group(required=True)
    outputs.add_argument(
        "-o",
        "--output",
        type=_given,
        metavar="FILE",
        help="the JSON Lines file to write or resume; - for stdout (not resumable)",
    )
    outputs.add_argument(
        "--parquet",
        type=_given,
        metavar="FILE",
        help=(
            "the Parquet file to write or resume instead: one row per id (job_id, state, "
            "extraction, error), needs pyarrow (the arrow extra)"
        ),
    )
    many.add_argument(
        "--concurrency", type=_positive_int, default=16, metavar="N", help="default: 16"
    )
    many.add_argument("--format", choices=get_args(ExtractionFormat), default=None)
    many.add_argument(
        "--retry-failed",
        action="store_true",
        help="fetch again the ids whose line is a failure (appending; the last line wins)",
    )
    many.add_argument(
        "--force",
        action="store_true",
        help="replace the output file instead of resuming it: a new export, also over a file "
        "that is not one",
    )
    many.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress (bar, or lines on stderr when it is not a terminal); the summary stays",
    )

    serve = _subcommand(
        commands,
        "serve",
        help="run the local emulator of the service until Ctrl-C",
        description=textwrap.dedent(
            f"""\
            Run the bundled emulator of the service (a test double: plain HTTP, in-memory data)
            and print the export lines that point '{PROG}' and the client at it. The API key is
            --api-key, else env {ENV_API_KEY}, else a new one, printed."""
        ),
        service=False,
    )
    serve.add_argument("--host", type=_given, default="127.0.0.1", help="default: 127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000, help="default: 8000; 0 picks one")
    serve.add_argument("--api-key", type=_given, metavar="KEY", default=argparse.SUPPRESS)
    serve.add_argument(
        "--seed", type=int, default=0, help="seed of the generated data (default: 0)"
    )
    serve.add_argument(
        "--resources", type=_non_negative_int, default=200, metavar="N", help="default: 200"
    )
    serve.add_argument(
        "--jobs",
        type=_non_negative_int,
        default=50,
        metavar="N",
        help="extraction jobs (default: 50)",
    )
    serve.add_argument(
        "--write-ids",
        type=_given,
        metavar="FILE",
        help="write the seeded extraction job ids to FILE, one per line, once listening "
        "(for extract-many)",
    )
    serve.add_argument("--force", action="store_true", help=FORCE_HELP)
    serve.add_argument(
        "--strict",
        action="store_true",
        help="refuse with a 422 what the spec leaves open (unknown fields, out-of-range paging)",
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not loopback (the emulator has no TLS: test use only)",
    )

    demo = _subcommand(
        commands,
        "demo",
        help="show what the library does, against an emulator started in-process",
        description=(
            "Start the emulator on a free loopback port and run a short tour: a search, a walk "
            "over pages, a bulk fetch with injected faults, a link preview and webhook logs. "
            "Needs no API key, no URL and no network."
        ),
        service=False,
    )
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated data (default: 7)")
    return parser


# The module (under asyncsearch._cli) and function of each command, imported on use.
_COMMANDS = {
    "search": ("_commands", "search"),
    "extract": ("_commands", "extract"),
    "link": ("_commands", "link"),
    "webhook-logs": ("_commands", "webhook_logs"),
    "extract-many": ("_export", "extract_many"),
    "serve": ("_serve", "serve"),
    "demo": ("_demo", "demo"),
}


def _have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class _FlagsFormatter(logging.Formatter):
    """Log lines of the library with its argument names said as the command's flags."""

    def format(self, record: logging.LogRecord) -> str:
        return speak_flags(super().format(record))


def _configure_logging(verbosity: int) -> None:
    logger = logging.getLogger("asyncsearch")
    if verbosity <= 0:
        # Quiet by default: without a handler Python prints WARNING records bare on stderr,
        # such as the note that a walk stopped at --max-items, which the output already says.
        logger.addHandler(logging.NullHandler())
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FlagsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asyncsearch`` command on ``argv`` (default ``sys.argv[1:]``); the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not _have_rich():
        print(INSTALL_HINT, file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(getattr(args, "verbose", 0) or 0)
    module_name, function_name = _COMMANDS[args.command]
    module = importlib.import_module(f"{__name__}.{module_name}")
    command: Command = getattr(module, function_name)
    exit_codes = module.EXIT_CODES if hasattr(module, "EXIT_CODES") else None
    try:
        return run_command(command, args, exit_codes=exit_codes)
    except KeyboardInterrupt:
        # A Ctrl-C outside the event loop (while importing or cleaning up).
        error("interrupted")
        return EXIT_SIGINT
