"""``asyncsearch demo``: a short tour of the library against an emulator started in-process."""

from __future__ import annotations

import random
import time
import uuid
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from asyncsearch import AsyncSearchClient

from ._render import hits_table, link_preview_table, stdout_console, webhook_logs_table
from ._run import EXIT_OK, PROG, Context, count

if TYPE_CHECKING:
    from asyncsearch.testing import ServiceEmulator

__all__ = ["demo"]

N_RESOURCES = 1000
N_JOBS = 300
N_UNKNOWN = 5  # ids that do not exist, to show failures reported per id
FAULT_RATE_503 = 0.05
FAULT_LATENCY = 0.005


def _heading(console: Console, title: str, code: str) -> None:
    console.print()
    console.rule(Text(title, style="bold"), align="left")
    console.print(Text(code, style="dim"))


def _facts(*rows: tuple[str, str]) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for name, value in rows:
        if value:
            table.add_row(Text(name), Text(value))
    return table


async def _search(console: Console, client: AsyncSearchClient) -> None:
    _heading(console, "1. Search", 'page = await client.search("invoice", page_size=5)')
    started = time.perf_counter()
    page = await client.search("invoice", page_size=5)
    elapsed = time.perf_counter() - started
    console.print(hits_table(page.hits))
    console.print(
        f"The top {len(page.hits)} of {count(page.total, 'hit')}, with scores and matched chunks, "
        f"in {elapsed * 1000:.0f} ms."
    )


async def _pages(console: Console, client: AsyncSearchClient) -> None:
    _heading(
        console,
        "2. Walking pages",
        'pager = client.search_pages("quarterly report", page_size=20, max_pages=5)',
    )
    table = Table()
    table.add_column("page", justify="right")
    table.add_column("hits", justify="right")
    table.add_column("has more")
    table.add_column("first hit")
    started = time.perf_counter()
    hits = 0
    pager = client.search_pages("quarterly report", page_size=20, max_pages=5)
    async with pager as pages:
        number = 0
        async for page in pages:
            number += 1
            hits += len(page.hits)
            first = (page.hits[0].name or "") if page.hits else ""
            table.add_row(str(number), str(len(page.hits)), str(page.has_more), Text(first))
    elapsed = time.perf_counter() - started
    console.print(table)
    resume = (
        f"pager.next_page = {pager.next_page} resumes the walk later"
        if pager.next_page is not None
        else "the walk is complete"
    )
    console.print(
        f"{hits} of {count(pager.total or 0, 'hit')} in {elapsed * 1000:.0f} ms; each next "
        f"page was requested while the current one was handled; {resume}."
    )


async def _bulk(console: Console, client: AsyncSearchClient, emulator: ServiceEmulator) -> None:
    _heading(
        console,
        "3. Bulk fetch with retries",
        "patient = client.with_options(max_retries=5)  # shares the connection pool\n"
        "async with patient.iter_extractions(job_ids, concurrency=16) as results: ...",
    )
    rng = random.Random(0)
    unknown = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(N_UNKNOWN)]
    job_ids = [job["id"] for job in emulator.jobs()] + unknown
    emulator.faults.set("extract", rate_503=FAULT_RATE_503, latency=FAULT_LATENCY)
    console.print(
        f"The emulator now answers {FAULT_RATE_503:.0%} of extraction requests with 503 and "
        f"waits {FAULT_LATENCY * 1000:.0f} ms before each answer; {N_UNKNOWN} of the "
        f"{len(job_ids)} ids do not exist."
    )
    emulator.stats.reset()
    ok = failed = 0
    failures: dict[str, int] = {}
    progress = Progress(
        TextColumn("fetching"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    started = time.perf_counter()
    with progress:
        task = progress.add_task("fetching", total=len(job_ids))
        # More retries than the default 2, so that a 503 three times in a row (one id in
        # thousands at this rate) does not fail an id in the demo.
        patient = client.with_options(max_retries=5)
        async with patient.iter_extractions(job_ids, concurrency=16) as results:
            async for result in results:
                if result.error is None:
                    ok += 1
                else:
                    failed += 1
                    name = type(result.error).__name__
                    failures[name] = failures.get(name, 0) + 1
                progress.advance(task)
    elapsed = time.perf_counter() - started
    emulator.faults.clear("extract")
    requests = emulator.stats.count("extract")
    refused = sum(1 for r in emulator.requests if r.endpoint == "extract" and r.status == 503)
    why = ", ".join(f"{n} {name}" for name, n in sorted(failures.items()))
    console.print(
        _facts(
            ("results", f"{ok + failed}: {ok} ok, {failed} failed" + (f" ({why})" if why else "")),
            ("requests", f"{requests}, of which {refused} got a 503 and were retried"),
            ("time", f"{elapsed:.2f} s, {requests / elapsed:.0f} requests/s"),
        )
    )
    console.print(
        "Every id came back exactly once, as a job or as an error: a 404 or an exhausted "
        "retry never aborts the batch."
    )


async def _link(console: Console, client: AsyncSearchClient, emulator: ServiceEmulator) -> None:
    url = emulator.page_urls[0]
    _heading(console, "4. Link preview", "preview = await client.link_preview(url)")
    console.print(Text(f"url = {url!r}", style="dim"))
    preview = await client.link_preview(url)
    console.print(Panel(link_preview_table(preview), expand=False))


async def _webhooks(console: Console, client: AsyncSearchClient, emulator: ServiceEmulator) -> None:
    # A job whose webhook failed and then got through shows what the logs are for.
    def statuses(job_id: str) -> list[Any]:
        return [log.get("status") for log in emulator.webhook_logs(job_id)]

    jobs = [job["id"] for job in emulator.jobs()]
    job_id = next(
        (j for j in jobs if "failed" in statuses(j) and statuses(j)[-1] == "success"),
        next(j for j in jobs if statuses(j)),
    )
    _heading(console, "5. Webhook logs", "logs = await client.list_webhook_logs(job_id)")
    console.print(Text(f"job_id = {job_id!r}", style="dim"))
    logs = await client.list_webhook_logs(job_id)
    console.print(webhook_logs_table(logs))
    log = await client.get_webhook_log(job_id, logs[-1].id)
    console.print(Text("log = await client.get_webhook_log(job_id, logs[-1].id)", style="dim"))
    console.print(
        _facts(
            ("status", f"{log.status} ({log.status_code})"),
            ("request payload", _cut(log.request_payload)),
            ("response body", _cut(log.response_body)),
        )
    )


def _cut(value: Any, limit: int = 100) -> str:
    text = "" if value is None else " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def demo(ctx: Context) -> int:
    """``asyncsearch demo``: start an emulator; search, page, bulk-fetch, preview, read logs."""
    from asyncsearch.testing import ServiceEmulator

    console = stdout_console()
    started = time.perf_counter()
    emulator = ServiceEmulator(seed=ctx.args.seed, n_resources=N_RESOURCES, n_jobs=N_JOBS)
    async with (
        emulator,
        AsyncSearchClient(api_key=emulator.api_key, base_url=emulator.base_url) as client,
    ):
        console.print(
            Panel(
                Text.assemble(
                    ("asyncsearch demo\n", "bold"),
                    f"An emulator of the service runs in this process on {emulator.base_url}, "
                    f"with {N_RESOURCES} resources and {N_JOBS} extraction jobs (seed "
                    f"{ctx.args.seed}). Every call below goes over real HTTP on loopback.",
                ),
                expand=False,
            )
        )
        await _search(console, client)
        await _pages(console, client)
        await _bulk(console, client, emulator)
        await _link(console, client, emulator)
        await _webhooks(console, client, emulator)
    console.print()
    console.print(
        Panel(
            Text.assemble(
                f"Done in {time.perf_counter() - started:.1f} s.\n",
                f"Run '{PROG} serve' to keep an emulator running for your own code, and "
                f"'{PROG} --help' for the commands.",
            ),
            expand=False,
        )
    )
    return EXIT_OK
