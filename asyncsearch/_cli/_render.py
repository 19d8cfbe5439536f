"""Terminal output shared by the commands and the demo: rich tables for people, JSON for pipes."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from asyncsearch.models import ImageDescriptor, LinkPreview, SearchHit, WebhookLogSummary

from ._run import count

__all__ = [
    "hits_table",
    "link_preview_table",
    "snippet",
    "stderr_console",
    "stdout_console",
    "webhook_logs_table",
    "write_json_line",
    "write_pretty_json",
    "write_text",
]

SNIPPET_LENGTH = 90


class _ResultConsole(Console):
    """A console whose closed pipe ends the command like any Unix tool's (exit 141)."""

    def on_broken_pipe(self) -> None:
        # rich's default exits with 1, which reads as "the service failed"; the command's runner
        # turns BrokenPipeError into 141 (128 + SIGPIPE), as for --json output.
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    """The console for results; rich drops colours by itself when stdout is not a terminal."""
    return _ResultConsole(highlight=False)


def stderr_console() -> Console:
    """The console for progress bars and messages."""
    return Console(stderr=True, highlight=False)


def write_json_line(value: Any) -> None:
    """Write ``value`` in its wire form as one JSON line on stdout."""
    # Bytes go to the binary buffer: flush the text layer first so nothing is reordered.
    sys.stdout.flush()
    sys.stdout.buffer.write(msgspec.json.encode(value) + b"\n")


def write_pretty_json(value: Any) -> None:
    """Write ``value`` in its wire form as indented JSON on stdout."""
    sys.stdout.flush()
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")
    sys.stdout.buffer.flush()


def write_text(text: str) -> None:
    """Write ``text`` on stdout as it is, ending with one newline."""
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def snippet(hit: SearchHit, limit: int = SNIPPET_LENGTH) -> str:
    """The text of the hit's best-scoring chunk, on one line and cut to ``limit`` characters."""
    chunks = [chunk for chunk in hit.chunks if chunk.text]
    if not chunks:
        return ""
    best = max(chunks, key=lambda chunk: chunk.score if chunk.score is not None else -1.0)
    return _shorten(best.text or "", limit)


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def hits_table(hits: Iterable[SearchHit], *, first: int = 1, title: str | None = None) -> Table:
    """A table of search hits: rank, score, kind, then name, id and best chunk stacked.

    Stacked, because a column of 36-character ids next to the names and snippets would not fit
    an 80-column terminal (or a pipe, which rich treats as 80 columns).
    """
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, expand=False)
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("name, id and best chunk", min_width=36)
    for rank, hit in enumerate(hits, first):
        # Text, never a plain str: a str cell is read as rich markup, and names are user data.
        cell = Text(hit.name or "(no name)", style="bold")
        cell.append("\n")
        cell.append(hit.id, style="cyan")
        best = snippet(hit)
        if best:
            cell.append("\n")
            cell.append(best, style="dim")
        table.add_row(Text(str(rank)), Text(_score(hit.score)), Text(hit.kind or ""), cell)
    return table


def webhook_logs_table(logs: Iterable[WebhookLogSummary]) -> Table:
    """A table of webhook deliveries: attempt, status, then log id, time and error stacked."""
    table = Table(box=box.SIMPLE_HEAD, expand=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("log id, fired at, error", min_width=36)
    for log in logs:
        status = Text(log.status or "")
        if log.status == "success":
            status.stylize("green")
        elif log.status == "failed":
            status.stylize("red")
        if log.status_code is not None:
            status.append(f" ({log.status_code})")
        cell = Text(log.id, style="cyan")
        if log.fired_at:
            cell.append(f"\n{log.fired_at}")
        if log.error_message:
            cell.append(f"\n{log.error_message}", style="dim")
        attempt = "" if log.attempt_number is None else str(log.attempt_number)
        table.add_row(Text(attempt), status, cell)
    return table


def _image(image: ImageDescriptor | None) -> str:
    if image is None or not image.url:
        return ""
    size = f" ({image.width}x{image.height})" if image.width and image.height else ""
    return f"{image.url}{size}"


def link_preview_table(preview: LinkPreview) -> Table:
    """A two-column table of a link preview's fields."""
    table = Table(show_header=False, expand=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    metadata = preview.metadata if isinstance(preview.metadata, dict) else {}
    for name, value in (
        ("url", preview.url),
        ("title", preview.title),
        ("type", preview.type),
        ("site", preview.site_name),
        ("description", preview.description),
        ("image", _image(preview.image)),
        ("favicon", _image(preview.favicon)),
        ("metadata", count(len(metadata), "tag") if metadata else ""),
    ):
        if value:
            table.add_row(Text(name), Text(str(value)))
    return table
