"""Walking search results page by page: prefetching against a sequential and a pipelined walk.

    python -m benchmarks.paging [--pages 20] [--page-size 100] [--latency 0.02] [--work 0.01]
                                [--work-kind both|sleep|cpu] [--embeddings | --no-embeddings]
                                [--rounds 9] [--uvloop] [--quick] [--json PATH]

A benchmark server (``benchmarks._server``) in a separate process answers ``POST /v2/search``
after ``--latency`` seconds with page ``n`` of ``--pages`` pages of ``--page-size`` hits (every
field filled and, by default, 512 + 768 embedding values per hit, as the service sends them; a
100-hit page is then ~2.5 MB and takes about as long to decode as a round trip). The caller does
``--work`` seconds of work per page, at the first hit of each page: ``sleep`` awaits
``asyncio.sleep`` (waiting on something else, the event loop stays free), and ``cpu`` spins
without yielding (the event loop is blocked, the way parsing or hashing blocks it). The server is
in another process because a blocking caller would stall a server in its own.

Variants, each walking every hit:

- ``hand-written sequential walk`` (the baseline): a bare aiohttp loop, one page after the other,
  decoded with ``msgspec.json.Decoder(SearchPage)``;
- ``asyncsearch search_hits, prefetch=False``;
- ``asyncsearch search_hits, prefetch=True``: requests page ``n + 1`` before it decodes page
  ``n``, the moment page ``n`` is in when the fields before its hits say there is more (the
  server writes ``total``, ``hasMore``, ``hits`` compact, in the spec's order), else after a
  view of ``hasMore`` and the hit ids;
- ``hand-pipelined walk, view first``: a bare loop that reads that view of every page before
  it sends the next request;
- ``hand-pipelined walk, speculative`` (the limit): a bare loop that sends the request for page
  ``n + 1`` the moment page ``n``'s bytes are in, before reading anything of it, and cancels it
  when page ``n`` turns out to be the last. It pays nothing to know whether to send, so no walk
  that waits for its answers can be faster; it also sends one request past the end of every walk.

The SDK's target is the share of the limit's speed-up it gets:
``(speed-up of search_hits - 1) / (speed-up of the speculative walk - 1)``, both over the
sequential walk in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import msgspec

from asyncsearch import AsyncSearchClient, SearchPage
from asyncsearch._models import SearchPageHead
from benchmarks._common import (
    Measurement,
    ServerProcess,
    Target,
    Targets,
    command_line,
    fmt_ratio,
    median,
    print_environment,
    print_table,
    ratio,
    rounds_async,
    run_loop,
    write_json,
)

API_KEY = "bench-key"
PREFETCH = "asyncsearch search_hits, prefetch=True"
NO_PREFETCH = "asyncsearch search_hits, prefetch=False"
BASELINE = "hand-written sequential walk"
VIEW_FIRST = "hand-pipelined walk, view first"
SPECULATIVE = "hand-pipelined walk, speculative"
OVERLAP_TARGET = 0.85
# Loop turns the hand-pipelined walks give a request before they block the loop, as the SDK's
# pager does: enough for aiohttp to write it on a pooled connection.
HEAD_START_TURNS = 3

Work = Callable[[], Awaitable[None]]


def make_work(kind: str, seconds: float) -> Work:
    """The caller's work on one page: ``sleep`` yields to the loop, ``cpu`` blocks it."""
    if kind == "sleep":

        async def sleep_work() -> None:
            await asyncio.sleep(seconds)

        return sleep_work

    async def cpu_work() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return cpu_work


async def sdk_walk(base_url: str, page_size: int, work: Work, *, prefetch: bool) -> int:
    seen = 0
    async with (
        AsyncSearchClient(api_key=API_KEY, base_url=base_url) as client,
        client.search_hits("quarterly report", page_size=page_size, prefetch=prefetch) as hits,
    ):
        async for _hit in hits:
            if seen % page_size == 0:
                await work()
            seen += 1
    return seen


_page_decoder = msgspec.json.Decoder(SearchPage)
_encoder = msgspec.json.Encoder()


async def hand_walk(base_url: str, page_size: int, work: Work) -> int:
    seen = 0
    headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:
        page_no = 1
        while True:
            body = _encoder.encode(
                {"text": "quarterly report", "pagination": {"page": page_no, "pageSize": page_size}}
            )
            async with session.post(f"{base_url}/v2/search", data=body) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}")
            page = _page_decoder.decode(raw)
            for _hit in page.hits:
                if seen % page_size == 0:
                    await work()
                seen += 1
            if not page.has_more or not page.hits:
                return seen
            page_no += 1


_head_decoder = msgspec.json.Decoder(SearchPageHead)


async def pipelined_walk(base_url: str, page_size: int, work: Work, *, speculative: bool) -> int:
    """Send the request for page n + 1 before decoding page n: at once, or after a view of n."""
    seen = 0
    headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def fetch(page_no: int) -> bytes:
            body = _encoder.encode(
                {"text": "quarterly report", "pagination": {"page": page_no, "pageSize": page_size}}
            )
            async with session.post(f"{base_url}/v2/search", data=body) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}")
                return raw

        page_no = 1
        pending: asyncio.Task[bytes] | None = asyncio.create_task(fetch(page_no))
        try:
            while pending is not None:
                raw = await pending
                pending = None
                if speculative:
                    pending = asyncio.create_task(fetch(page_no + 1))
                else:
                    head = _head_decoder.decode(raw)
                    if head.has_more and head.hits:
                        pending = asyncio.create_task(fetch(page_no + 1))
                for _ in range(HEAD_START_TURNS):
                    await asyncio.sleep(0)
                page = _page_decoder.decode(raw)
                for _hit in page.hits:
                    if seen % page_size == 0:
                        await work()
                    seen += 1
                if not page.has_more or not page.hits:
                    break
                page_no += 1
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.wait({pending})
    return seen


def _variants(
    base_url: str, page_size: int, expected: int, kinds: Sequence[str], seconds: float
) -> dict[str, Callable[[], Awaitable[Measurement]]]:
    variants: dict[str, Callable[[], Awaitable[Measurement]]] = {}
    for kind in kinds:
        work = make_work(kind, seconds)
        walks: dict[str, Callable[[], Awaitable[int]]] = {
            BASELINE: lambda work=work: hand_walk(base_url, page_size, work),  # type: ignore[misc]
            PREFETCH: lambda work=work: sdk_walk(base_url, page_size, work, prefetch=True),  # type: ignore[misc]
            NO_PREFETCH: lambda work=work: sdk_walk(base_url, page_size, work, prefetch=False),  # type: ignore[misc]
            VIEW_FIRST: lambda work=work: pipelined_walk(  # type: ignore[misc]
                base_url, page_size, work, speculative=False
            ),
            SPECULATIVE: lambda work=work: pipelined_walk(  # type: ignore[misc]
                base_url, page_size, work, speculative=True
            ),
        }
        for name, walk in walks.items():
            variants[f"{kind}|{name}"] = _timed(walk, expected)
    return variants


def _timed(
    walk: Callable[[], Awaitable[int]], expected: int
) -> Callable[[], Awaitable[Measurement]]:
    async def run() -> Measurement:
        wall, cpu = time.perf_counter(), time.process_time()
        seen = await walk()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if seen != expected:
            raise RuntimeError(f"walked {seen} hits, expected {expected}")
        return {"wall": wall, "cpu": cpu}

    return run


def ideal_speedup(pages: int, latency: float, work: float) -> float:
    """Sequential time over the time of a perfect prefetching walk (see the module docstring)."""
    sequential = pages * (latency + work)
    overlapped = latency + (pages - 1) * max(latency, work) + work
    return sequential / overlapped


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.paging", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.020, help="server latency, seconds")
    parser.add_argument("--work", type=float, default=0.010, help="caller work per page, seconds")
    parser.add_argument("--work-kind", choices=("both", "sleep", "cpu"), default="both")
    parser.add_argument(
        "--embeddings",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hits carry their embeddings (the default), as the service sends them",
    )
    # Nine, not five: the target is a ratio of two speed-ups, and on a shared VM a median of five
    # rounds moved it by 0.35 between runs of the same code (benchmarks/README.md, third round).
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (>= 5)")
    parser.add_argument("--uvloop", action="store_true", help="run the client on uvloop")
    parser.add_argument("--quick", action="store_true", help="a short walk, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.rounds = max(5, args.rounds)
    if args.quick:  # a smoke test: one round of a tiny walk, in seconds
        args.pages, args.page_size, args.latency, args.work = 3, 4, 0.001, 0.0005
        args.rounds = 1
    kinds = ("sleep", "cpu") if args.work_kind == "both" else (args.work_kind,)
    expected = args.pages * args.page_size

    server_args = ["--pages", str(args.pages), "--page-size", str(args.page_size)]
    server_args += ["--latency", str(args.latency)]
    if args.embeddings:
        server_args.append("--embeddings")

    async def run(base_url: str) -> dict[str, list[Measurement]]:
        variants = _variants(base_url, args.page_size, expected, kinds, args.work)
        for variant in variants.values():  # one untimed pass: imports, connections
            await variant()
        return await rounds_async(variants, args.rounds)

    with ServerProcess(*server_args) as server:
        samples = run_loop(run(server.base_url), use_uvloop=args.uvloop)

    ceiling = ideal_speedup(args.pages, args.latency, args.work)
    rows = []
    results: dict[str, Any] = {"kinds": {}, "rounds": args.rounds, "ceiling": ceiling}
    targets = Targets()
    for kind in kinds:
        base = median(samples[f"{kind}|{BASELINE}"], "wall")
        per_kind: dict[str, Any] = {}
        for name in (BASELINE, NO_PREFETCH, PREFETCH, VIEW_FIRST, SPECULATIVE):
            runs = samples[f"{kind}|{name}"]
            wall = median(runs, "wall")
            rows.append(
                [
                    kind,
                    name,
                    f"{wall * 1000:.0f}",
                    f"{wall / args.pages * 1000:.1f}",
                    fmt_ratio(ratio(base, wall)),
                    f"{median(runs, 'cpu') * 1000:.0f}",
                ]
            )
            per_kind[name] = {"wall": wall, "cpu": median(runs, "cpu")}
        results["kinds"][kind] = per_kind
        speedup = ratio(base, per_kind[PREFETCH]["wall"])
        limit = ratio(base, per_kind[SPECULATIVE]["wall"])
        share = (speedup - 1) / (limit - 1) if limit > 1 else float("nan")
        results.setdefault("overlap_share", {})[kind] = share
        targets.add(
            Target(
                f"share of the speculative walk's speed-up that search_hits gets, {kind} work",
                share,
                OVERLAP_TARGET,
                note=f"search_hits {speedup:.2f}x, speculative walk {limit:.2f}x, over "
                f"{BASELINE}; {ratio(base, per_kind[VIEW_FIRST]['wall']):.2f}x for the "
                "hand-written view-first walk",
            )
        )
    payload = "with embeddings" if args.embeddings else "without embeddings"
    print_table(
        f"Walking {args.pages} pages of {args.page_size} hits ({payload}), server latency "
        f"{args.latency * 1000:g} ms, caller work {args.work * 1000:g} ms per page; median of "
        f"{args.rounds} interleaved rounds, client on {'uvloop' if args.uvloop else 'asyncio'}; "
        f"speed-up over {BASELINE}",
        ["work", "walk", "wall ms", "ms / page", "speed-up", "client CPU ms"],
        rows,
    )
    print(
        "Without decoding costs (no embeddings), sequential: "
        f"{args.pages} x (latency + work) = "
        f"{args.pages * (args.latency + args.work) * 1000:.0f} ms; perfect overlap: latency + "
        f"{args.pages - 1} x max(latency, work) + work = "
        f"{(args.latency + (args.pages - 1) * max(args.latency, args.work) + args.work) * 1000:.0f}"
        f" ms; ceiling {ceiling:.2f}x\n"
    )
    targets.print()
    print_environment(command_line("paging", argv))
    results["targets"] = targets.as_json()
    results["params"] = {
        "pages": args.pages,
        "page_size": args.page_size,
        "latency": args.latency,
        "work": args.work,
        "embeddings": args.embeddings,
        "uvloop": args.uvloop,
    }
    write_json(args.json, {"benchmark": "paging", **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
