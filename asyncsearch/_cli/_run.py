"""Running one command: the event loop, signals, the client from flags and environment, exit codes.

Standard library and the public API of ``asyncsearch`` only: this module is imported for every
command, before it is known whether rich is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asyncsearch import (
    APIConnectionError,
    AsyncSearchClient,
    AsyncSearchError,
    AuthenticationError,
    ConfigurationError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from asyncsearch._config import NOT_GIVEN

__all__ = [
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_USAGE",
    "PROG",
    "Command",
    "CommandError",
    "Context",
    "Runtime",
    "count",
    "error",
    "run_command",
    "speak_flags",
]

ENV_API_KEY = "ASYNCSEARCH_API_KEY"
ENV_BASE_URL = "ASYNCSEARCH_BASE_URL"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_SIGINT = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C
EXIT_SIGTERM = 143  # 128 + SIGTERM
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as for `... | head` with any Unix tool

PROG = "asyncsearch"


class CommandError(Exception):
    """An expected failure: its message is printed without a traceback and ``code`` returned."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def error(message: str) -> None:
    """Print one message for a shell user on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


class Runtime:
    """The running command's task and the signals it got.

    The first SIGINT or SIGTERM goes to ``on_signal`` when a command set one (it returns True
    when it stops by itself, as ``extract-many`` does after writing what is in flight); otherwise,
    and for any later signal, the command's task is cancelled.
    """

    def __init__(self, exit_codes: dict[int, int]) -> None:
        self.exit_codes = exit_codes
        self.signal: int | None = None
        self.on_signal: Callable[[int], bool] | None = None
        self._task: asyncio.Task[Any] | None = None

    @property
    def exit_code(self) -> int:
        """The exit status for the signal received (130 for SIGINT, 143 for SIGTERM)."""
        assert self.signal is not None
        return self.exit_codes.get(self.signal, EXIT_SIGINT)

    def cancel(self) -> None:
        """Cancel the command's task: it stops at once, dropping what is in flight."""
        if self._task is not None:
            self._task.cancel()

    def _handle(self, signum: int) -> None:
        first = self.signal is None
        if first:
            self.signal = signum
        if first and self.on_signal is not None and self.on_signal(signum):
            return
        self.cancel()

    async def run(self, command: Awaitable[int]) -> int:
        """Await ``command`` with SIGINT and SIGTERM routed to ``_handle``."""
        self._task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, self._handle, signum)
            except (NotImplementedError, RuntimeError, ValueError):
                # Windows, or not the main thread: Ctrl-C still arrives as KeyboardInterrupt.
                continue
            installed.append(signum)
        try:
            return await command
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)


def _missing(what: str, env: str, option: str) -> str:
    """Refuse a command that has no value for ``option`` from its flag or the environment."""
    flag = "--" + option.replace("_", "-")
    raise CommandError(
        f"no {what}: set {env} or pass {flag} (for a local emulator, run '{PROG} serve')",
        EXIT_USAGE,
    )


@dataclass
class Context:
    """What a command gets: its arguments, the runtime, and what it asked the service for."""

    args: argparse.Namespace
    runtime: Runtime
    #: Names what the command asked for, for a "not found" message ("extraction job ...").
    subject: str | None = None
    _key: str | None = field(default=None, repr=False)

    def client(self) -> AsyncSearchClient:
        """The client from ``--api-key``/``--base-url``/``--base-id`` and the environment."""
        args = self.args
        key, base_url = (
            getattr(args, name, None) or os.environ.get(env) or _missing(what, env, name)
            for name, env, what in (
                ("api_key", ENV_API_KEY, "API key"),
                ("base_url", ENV_BASE_URL, "service URL"),
            )
        )
        self._key = key
        max_retries = getattr(args, "max_retries", None)
        timeout = getattr(args, "timeout", None)
        return AsyncSearchClient(
            api_key=key,
            base_url=base_url,
            base_id=getattr(args, "base_id", None),
            allow_http=bool(getattr(args, "allow_http", False)),
            # No --timeout keeps the library's default (None would turn every limit off).
            timeout=NOT_GIVEN if timeout is None else timeout,
            max_retries=2 if max_retries is None else max_retries,
        )

    def redact(self, text: str) -> str:
        """``text`` with the API key blanked out (the library never puts it in a message)."""
        if self._key:
            text = text.replace(self._key, "***")
        return text


Command = Callable[[Context], Awaitable[int]]


# The library's argument names, as its messages and logs say them, and the flags that set them.
_FLAG_WORDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        # The command line never sets first_page: its pages start at 1, as the service's do.
        (r", the client's first_page,", ","),
        (r"\bstart_page=(-?\d+)", r"--page \1"),
        (r"\bstart_page\b", "--page"),
        (r"\bpage_size=(\d+)", r"--page-size \1"),
        (r"\bpage_size\b", "--page-size"),
        (r"\bmax_items=(\d+)", r"--max-items \1"),
        (r"\bmax_items\b", "--max-items"),
        # search --parquet turns --max-items into a number of pages.
        (r"\bat max_pages=(\d+)", r"after \1 pages (--max-items)"),
        (r"\bmax_pages\b", "--max-items"),
        (r"\bmax_retries\b", "--max-retries"),
        (r"\bconcurrency( must|=)", r"--concurrency\1"),
        (r"\bbase_url\b", "--base-url"),
        (r"\bbase_id\b", "--base-id"),
        (r"\bapi_key\b", "--api-key"),
        (r"\bpass --api-key=", "pass --api-key"),
    )
)


def speak_flags(text: str) -> str:
    """A message of the library with its argument names said as the command's flags
    (``start_page=2`` -> ``--page 2``)."""
    for pattern, replacement in _FLAG_WORDS:
        text = pattern.sub(replacement, text)
    return text


def _message_for(exc: AsyncSearchError, ctx: Context) -> tuple[str, int]:
    if isinstance(exc, AuthenticationError):
        return (
            f"the service refused the API key (401); check {ENV_API_KEY} or --api-key",
            EXIT_FAILURE,
        )
    if isinstance(exc, PermissionDeniedError):
        return f"the API key may not do this (403): {exc}", EXIT_FAILURE
    if isinstance(exc, NotFoundError):
        subject = ctx.subject or "what was asked for"
        return f"not found: {subject} (the service answered: {exc})", EXIT_FAILURE
    if isinstance(exc, ConfigurationError) and "allow_http" in str(exc):
        return f"{exc} (on the command line: --allow-http)", EXIT_USAGE
    if isinstance(exc, InvalidRequestError | ConfigurationError):
        return str(exc), EXIT_USAGE
    if isinstance(exc, APIConnectionError):
        return f"could not talk to the service: {exc}", EXIT_FAILURE
    return str(exc), EXIT_FAILURE


def run_command(
    command: Command, args: argparse.Namespace, *, exit_codes: dict[int, int] | None = None
) -> int:
    """Run ``command`` in a new event loop and turn its outcome into an exit status."""
    codes: dict[int, int] = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}
    codes.update(exit_codes or {})
    runtime = Runtime(codes)
    ctx = Context(args, runtime)
    try:
        return asyncio.run(runtime.run(command(ctx)))
    except asyncio.CancelledError:
        if runtime.signal is None:
            raise
        return runtime.exit_code
    except KeyboardInterrupt:
        return codes[signal.SIGINT]
    except CommandError as exc:
        error(ctx.redact(exc.message))
        return exc.code
    except AsyncSearchError as exc:
        message, code = _message_for(exc, ctx)
        error(ctx.redact(speak_flags(message)))
        return code
    except BrokenPipeError:
        # The reader went away (`asyncsearch search x --json | head`): stop quietly, and point
        # stdout at /dev/null so that the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        error(ctx.redact(str(exc)))
        return EXIT_FAILURE


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for one: "1 hit", "2 hits", "0 hits"."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
