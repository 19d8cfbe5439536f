"""The commands that make one call or one walk: search, extract, link, webhook-logs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rich.text import Text

from asyncsearch import AsyncSearchClient, ExtractionJob, SearchFilters, SearchHit, image_data_url

from ._outputs import check_not_input, check_output
from ._render import (
    hits_table,
    link_preview_table,
    stdout_console,
    webhook_logs_table,
    write_json_line,
    write_pretty_json,
    write_text,
)
from ._run import EXIT_OK, CommandError, Context, count

__all__ = ["extract", "link", "search", "webhook_logs"]

MAX_PAGE_SIZE = 100  # the spec's limit of pageSize
DEFAULT_MAX_ITEMS = 20  # hits shown when --max-items is not given (without --parquet)

T = TypeVar("T")


def _filters(args: argparse.Namespace) -> SearchFilters | None:
    values = {
        "kinds": args.kinds,
        "color": args.color,
        "parent_ids": args.parent_ids,
        "ancestor_ids": args.ancestor_ids,
        "tag_ids": args.tag_ids,
        "user_ids": args.user_ids,
        "created_after": args.created_after,
        "created_before": args.created_before,
    }
    given = {name: value for name, value in values.items() if value is not None}
    # No flag given: send no filters at all rather than an empty object.
    return SearchFilters(**given) if given else None


async def search(ctx: Context) -> int:
    """``asyncsearch search``: walk the hits of a search, as a table or JSON lines."""
    args = ctx.args
    if args.parquet is not None:
        if args.image:
            check_not_input(args.image, "--image", args.parquet, "--parquet")
        check_output(args.parquet, "--parquet", force=args.force, renamed=True)
    image = image_data_url(args.image) if args.image else None
    if args.resource_id:
        ctx.subject = f"resource {args.resource_id}"
    query: dict[str, Any] = {
        "image": image,
        "resource_id": args.resource_id,
        "filters": _filters(args),
        "precision": args.precision,
        "incognito": True if args.incognito else None,
        "sort": args.sort,
        "start_page": args.page,
    }
    if args.parquet is not None:
        return await _search_parquet(ctx, query)
    max_items = DEFAULT_MAX_ITEMS if args.max_items is None else args.max_items
    page_size = args.page_size or min(max_items, MAX_PAGE_SIZE)
    found: list[SearchHit] = []
    async with ctx.client() as client:
        pager = client.search_hits(args.text, page_size=page_size, max_items=max_items, **query)
        async with pager as hits:
            async for hit in hits:
                if args.json:
                    write_json_line(hit)
                else:
                    found.append(hit)
    if args.json:
        return EXIT_OK
    console = stdout_console()
    if not found:
        console.print("no hits")
        return EXIT_OK
    console.print(hits_table(found))
    total = pager.total
    if total is not None and total > len(found):
        summary = f"{len(found)} of {count(total, 'hit')}"
    else:
        summary = count(len(found), "hit")
    console.print(Text(summary, style="dim"))
    return EXIT_OK


async def _search_parquet(ctx: Context, query: dict[str, Any]) -> int:
    """``search --parquet FILE``: every hit (or --max-items) into a Parquet file, page by page."""
    from asyncsearch.arrow import HitBatches

    from ._parquet import HitParquet

    args = ctx.args
    max_items = args.max_items
    page_size = args.page_size or MAX_PAGE_SIZE
    max_pages = None if max_items is None else -(-max_items // page_size)
    builder = HitBatches()
    async with ctx.client() as client:
        pager = client.search_pages(args.text, page_size=page_size, max_pages=max_pages, **query)
        out = HitParquet(args.parquet)
        taken = 0
        try:
            async with pager as pages:
                async for page in pages:
                    room = None if max_items is None else max_items - taken
                    out.write(builder.add(page, room))
                    taken += len(page.hits) if room is None else min(room, len(page.hits))
                    if max_items is not None and taken >= max_items:
                        break
            out.write(builder.finish())
        finally:
            # Interrupted or failed: what was walked so far is kept (widths still unknown are
            # settled as at the end of a walk).
            if builder._held:
                out.write(builder.finish())
            out.close(builder.schema)
    total = f" ({pager.total} in all)" if pager.total is not None else ""
    print(f"search: wrote {count(out.rows, 'hit')} to {args.parquet}{total}", file=sys.stderr)
    return EXIT_OK


async def _show(
    ctx: Context,
    subject: str,
    call: Callable[[AsyncSearchClient], Awaitable[T]],
    pretty: Callable[[T], object],
) -> int:
    """Make one call (``subject`` names what it asks for, if not found) and write its answer
    as one JSON line with --json, else with ``pretty``."""
    ctx.subject = subject
    async with ctx.client() as client:
        value = await call(client)
    if ctx.args.json:
        write_json_line(value)
    else:
        pretty(value)
    return EXIT_OK


async def extract(ctx: Context) -> int:
    """``asyncsearch extract``: one extraction job as JSON, or its Markdown caption."""
    args = ctx.args
    pretty = _write_caption if args.format == "markdown" else write_pretty_json
    return await _show(
        ctx,
        f"extraction job {args.job_id}",
        lambda client: client.get_extraction(args.job_id, format=args.format),
        pretty,
    )


def _write_caption(job: ExtractionJob) -> None:
    common = job.extraction.common if job.extraction is not None else None
    if common is None or not common.caption:
        raise CommandError(f"extraction job {job.id} has no caption to show (state: {job.state})")
    # Written as is, not through rich, which would wrap long lines to the terminal's width.
    write_text(common.caption)


async def link(ctx: Context) -> int:
    """``asyncsearch link``: the link preview of a URL."""
    args = ctx.args
    return await _show(
        ctx,
        f"a preview of {args.url}",
        lambda client: client.link_preview(args.url, type=args.type),
        lambda preview: stdout_console().print(link_preview_table(preview)),
    )


async def webhook_logs(ctx: Context) -> int:
    """``asyncsearch webhook-logs``: the webhook deliveries of a job, or one of them."""
    args = ctx.args
    if args.log_id is not None:
        return await _show(
            ctx,
            f"webhook log {args.log_id} of extraction job {args.job_id}",
            lambda client: client.get_webhook_log(args.job_id, args.log_id),
            write_pretty_json,
        )
    ctx.subject = f"extraction job {args.job_id}"
    async with ctx.client() as client:
        logs = await client.list_webhook_logs(args.job_id)
    if args.json:
        for summary in logs:
            write_json_line(summary)
        return EXIT_OK
    console = stdout_console()
    if not logs:
        console.print(f"no webhook deliveries for extraction job {args.job_id}")
        return EXIT_OK
    console.print(webhook_logs_table(logs))
    return EXIT_OK
