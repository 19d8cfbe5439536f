"""``asyncsearch serve``: run the bundled emulator of the service until Ctrl-C."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shlex
import signal
import sys
import tempfile
from typing import TYPE_CHECKING

from ._outputs import check_output
from ._run import (
    ENV_API_KEY,
    ENV_BASE_URL,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CommandError,
    Context,
    count,
)

if TYPE_CHECKING:
    from asyncsearch.testing import ServiceEmulator

__all__ = ["EXIT_CODES", "serve"]

#: Ctrl-C and SIGTERM are how a server is meant to stop: they end it with status 0.
EXIT_CODES = {signal.SIGINT: EXIT_OK, signal.SIGTERM: EXIT_OK}


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _announce(
    emulator: ServiceEmulator, *, generated_key: bool, remote: bool, ids_file: str | None
) -> None:
    """Print where the emulator listens and the lines that point a shell at it."""
    url = emulator.base_url
    jobs = emulator.jobs()
    print(f"asyncsearch emulator listening on {url}")
    print(
        f"data: {count(len(emulator.resources()), 'resource')}, "
        f"{count(len(jobs), 'extraction job')}, "
        f"{count(len(emulator.page_urls), 'link preview page')}"
    )
    print("\nTo use it from another shell:")
    if generated_key:
        # The one place a key is ever printed: it was made here, for this test double.
        print(
            f"  export {ENV_BASE_URL}={shlex.quote(url)} "
            f"{ENV_API_KEY}={shlex.quote(emulator.api_key)}"
        )
    else:
        print(f"  export {ENV_BASE_URL}={shlex.quote(url)}")
        print(f"  ({ENV_API_KEY}: the key given to serve, not repeated here)")
    if remote:
        print("  (from another host, add --allow-http: the emulator speaks plain HTTP)")
    print("Then try:")
    print(f"  {PROG} search invoice")
    if jobs:
        print(f"  {PROG} extract {jobs[0]['id']}")
        print(f"  {PROG} webhook-logs {jobs[0]['id']}")
    if emulator.page_urls:
        print(f"  {PROG} link {shlex.quote(emulator.page_urls[0])}")
    if ids_file is not None:
        print(f"  {PROG} extract-many {shlex.quote(ids_file)} -o results.jsonl")
    print("Press Ctrl-C to stop.", flush=True)


def _log_to_console() -> None:
    """The emulator's log lines on stderr, one each (a request aiohttp's parser refused, an
    emulator failure with its traceback), whatever -v says about the client's logging."""
    logger = logging.getLogger("asyncsearch.testing")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG} serve: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # not a second time through the "asyncsearch" logger of -v


def _write_ids(path: str, ids: list[str]) -> None:
    """Write job ids one per line, atomically: a reader sees no file or the whole of it."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".ids-", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.writelines(f"{job_id}\n" for job_id in ids)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


async def serve(ctx: Context) -> int:
    """``asyncsearch serve``: run the emulator until Ctrl-C or SIGTERM."""
    from asyncsearch.testing import serve_forever

    args = ctx.args
    if not _is_loopback(args.host) and not args.allow_remote:
        raise CommandError(
            f"refusing to listen on {args.host}: the emulator is a test double without TLS or "
            "real authentication; pass --allow-remote if you mean it",
            EXIT_USAGE,
        )
    ids_file = args.write_ids
    if ids_file is not None:
        # Checked before listening: a refused file is a usage error, not a server that stops.
        check_output(ids_file, "--write-ids", force=args.force, renamed=True)
    key = getattr(args, "api_key", None) or os.environ.get(ENV_API_KEY)
    generated = not key
    if not key:
        key = secrets.token_urlsafe(24)
    ready = False
    _log_to_console()

    def on_ready(emulator: ServiceEmulator) -> None:
        nonlocal ready
        if ids_file is not None:
            # Before the banner, so that the banner also says the file is complete.
            try:
                _write_ids(ids_file, [job["id"] for job in emulator.jobs()])
            except OSError as exc:
                raise CommandError(f"cannot write {ids_file}: {exc}") from None
        ready = True
        _announce(
            emulator,
            generated_key=generated,
            remote=not _is_loopback(args.host),
            ids_file=ids_file,
        )

    try:
        await serve_forever(
            host=args.host,
            port=args.port,
            api_key=key,
            seed=args.seed,
            n_resources=args.resources,
            n_jobs=args.jobs,
            strict=args.strict,
            on_ready=on_ready,
        )
    except OSError as exc:
        if ready:
            raise
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    finally:
        if ready:
            print("stopped", flush=True)
    return EXIT_OK
