"""The blocking client against the async one it runs: what the thread hop costs.

    python -m benchmarks.sync [--searches 200] [--requests 5000] [--concurrency 16]
                              [--latency 0.02] [--hops 5000] [--rounds 7] [--quick] [--json PATH]

A benchmark server (``benchmarks._server``) in a separate process answers ``POST /v2/search``
at once with a 10-hit page and ``GET /v2/extract/{id}`` with a ~3 KB job after ``--latency``
seconds. Measured in interleaved rounds, medians reported:

- ``--searches`` sequential searches, each on a warm connection: ``SearchClient.search`` (the
  caller's thread hands the call to the client's loop thread and waits), against
  ``await AsyncSearchClient.search`` in the caller's own loop (the baseline), and against the
  same async client driven through anyio's ``BlockingPortal.call``. Wall and CPU (all threads
  of the process) per call; the difference to the baseline is the hop's cost per call.
- ``--requests`` extraction jobs in one bulk call at ``--latency``:
  ``SearchClient.gather_extractions(ids)`` against ``await AsyncSearchClient.gather_extractions``
  (the baseline), and the blocking call over a generator of the same ids (read in a thread of
  their own, one ahead of the requests). Requests per second.
- ``--hops`` calls of a coroutine that returns at once, nothing else: the bare hop of each way to
  cross threads (``SearchClient``'s, ``asyncio.run_coroutine_threadsafe``, the portal's).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Iterator, Sequence

from anyio.from_thread import BlockingPortal, start_blocking_portal

from asyncsearch import AsyncSearchClient, SearchClient
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
    rounds_sync,
    write_json,
)
from benchmarks.fanout import job_ids

API_KEY = "bench-key"
AWAITED = "await AsyncSearchClient.search"
BLOCKING = "SearchClient.search"
PORTAL = "BlockingPortal.call(AsyncSearchClient.search)"
BULK_AWAITED = "await AsyncSearchClient.gather_extractions"
BULK_BLOCKING = "SearchClient.gather_extractions"
BULK_GENERATOR = "SearchClient.gather_extractions, ids from a generator"
HOP_CLIENT = "SearchClient's hop (call_soon_threadsafe, a Future)"
HOP_RCT = "asyncio.run_coroutine_threadsafe"
HOP_PORTAL = "anyio BlockingPortal.call"


def _timed(calls: int, run: Callable[[], object]) -> Measurement:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_us": wall / calls * 1e6, "cpu_us": cpu / calls * 1e6}


# ---------------------------------------------------------------------------------------------
# Sequential searches
# ---------------------------------------------------------------------------------------------


def awaited_searches(base_url: str, n: int) -> Measurement:
    async def main() -> Measurement:
        async with AsyncSearchClient(API_KEY, base_url=base_url) as client:
            await client.search("q")  # the connection, opened once
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                await client.search("q")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return {"wall_us": wall / n * 1e6, "cpu_us": cpu / n * 1e6}

    return asyncio.run(main())


def blocking_searches(base_url: str, n: int) -> Measurement:
    with SearchClient(API_KEY, base_url=base_url) as client:
        client.search("q")
        return _timed(n, lambda: client.search("q"))


def portal_searches(base_url: str, n: int) -> Measurement:
    with start_blocking_portal() as portal:
        client = portal.call(_make_client, base_url)
        try:
            portal.call(client.search, "q")
            return _timed(n, lambda: portal.call(client.search, "q"))
        finally:
            portal.call(client.aclose)


async def _make_client(base_url: str) -> AsyncSearchClient:
    return AsyncSearchClient(API_KEY, base_url=base_url)


# ---------------------------------------------------------------------------------------------
# One bulk call
# ---------------------------------------------------------------------------------------------


def _bulk(run: Callable[[], int], requests: int) -> Measurement:
    wall = time.perf_counter()
    got = run()
    wall = time.perf_counter() - wall
    if got != requests:
        raise RuntimeError(f"fetched {got} of {requests} jobs")
    return {"rps": requests / wall}


def awaited_bulk(base_url: str, ids: list[str], concurrency: int) -> Measurement:
    async def main() -> int:
        async with AsyncSearchClient(API_KEY, base_url=base_url) as client:
            results = await client.gather_extractions(ids, concurrency=concurrency)
        return sum(result.ok for result in results)

    return _bulk(lambda: asyncio.run(main()), len(ids))


def blocking_bulk(base_url: str, ids: list[str], concurrency: int, *, lazy: bool) -> Measurement:
    def run() -> int:
        source: Iterator[str] | list[str] = (job_id for job_id in ids) if lazy else ids
        with SearchClient(API_KEY, base_url=base_url) as client:
            results = client.gather_extractions(source, concurrency=concurrency)
        return sum(result.ok for result in results)

    return _bulk(run, len(ids))


# ---------------------------------------------------------------------------------------------
# The bare hop
# ---------------------------------------------------------------------------------------------


async def _nothing() -> None:
    return None


def hops(n: int) -> dict[str, Callable[[], Measurement]]:
    """A trivial call through each way to cross threads, each with a loop thread running."""
    client = SearchClient(API_KEY, base_url="http://127.0.0.1:1")
    client._runner.run(_nothing())  # starts the client's loop thread
    loop = client._runner.running[0] if client._runner.running else None
    assert loop is not None
    portal_cm = start_blocking_portal()
    portal: BlockingPortal = portal_cm.__enter__()
    variants: dict[str, Callable[[], Measurement]] = {
        HOP_CLIENT: lambda: _timed(n, lambda: client._runner.run(_nothing())),
        HOP_RCT: lambda: _timed(
            n, lambda: asyncio.run_coroutine_threadsafe(_nothing(), loop).result()
        ),
        HOP_PORTAL: lambda: _timed(n, lambda: portal.call(_nothing)),
    }
    _cleanups.append(lambda: portal_cm.__exit__(None, None, None))
    _cleanups.append(client.close)
    return variants


_cleanups: list[Callable[[], object]] = []


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sync", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--searches", type=int, default=200, help="sequential searches")
    parser.add_argument("--requests", type=int, default=5000, help="ids of the bulk call")
    # The bulk call's default: at 20 ms that is latency-bound (800 req/s), and what is measured
    # is what the facade adds to it; at 64 in flight this 2-core machine is CPU-bound instead.
    parser.add_argument("--concurrency", type=int, default=16, help="the bulk call's")
    parser.add_argument(
        "--latency", type=float, default=0.02, help="server delay of each job, seconds"
    )
    parser.add_argument("--hops", type=int, default=5000, help="trivial calls per hop variant")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="few calls, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def _rows(
    samples: dict[str, list[Measurement]], baseline: str, metrics: Sequence[str]
) -> list[list[str]]:
    rows = []
    for name, runs in samples.items():
        row = [name]
        for metric in metrics:
            value = median(runs, metric)
            row += [f"{value:,.1f}", fmt_ratio(ratio(value, median(samples[baseline], metric)))]
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rounds = 1 if args.quick else max(5, args.rounds)
    if args.quick:
        args.searches, args.requests, args.hops = 20, 200, 200
    ids = job_ids(args.requests)
    server_args = ["--pages", "1", "--page-size", "10", "--extract-latency", str(args.latency)]
    with ServerProcess(*server_args) as server:
        url = server.base_url
        searches = rounds_sync(
            {
                AWAITED: lambda: awaited_searches(url, args.searches),
                BLOCKING: lambda: blocking_searches(url, args.searches),
                PORTAL: lambda: portal_searches(url, args.searches),
            },
            rounds,
        )
        bulk = rounds_sync(
            {
                BULK_AWAITED: lambda: awaited_bulk(url, ids, args.concurrency),
                BULK_BLOCKING: lambda: blocking_bulk(url, ids, args.concurrency, lazy=False),
                BULK_GENERATOR: lambda: blocking_bulk(url, ids, args.concurrency, lazy=True),
            },
            rounds,
        )
    try:
        hopped = rounds_sync(hops(args.hops), rounds)
    finally:
        while _cleanups:
            _cleanups.pop()()

    metrics = ["wall_us", "cpu_us"]
    header = ["call", "wall µs / call", "vs awaited", "CPU µs / call", "vs awaited"]
    title = f"{args.searches} sequential searches (10-hit pages, no latency), median of {rounds}"
    print_table(
        title + f" interleaved rounds; ratios to {AWAITED}",
        header,
        _rows(searches, AWAITED, metrics),
    )
    latency = f"{args.latency * 1000:g} ms"
    print_table(
        f"One bulk call of {args.requests:,} ids, {args.concurrency} in flight, {latency} per job, "
        f"median of {rounds} interleaved rounds; ratios to {BULK_AWAITED}",
        ["call", "req/s", "vs awaited"],
        _rows(bulk, BULK_AWAITED, ["rps"]),
    )
    header = ["hop", "wall µs / call", f"vs {HOP_CLIENT}", "CPU µs / call", "vs it"]
    print_table(
        f"{args.hops:,} calls of a coroutine that returns at once, median of {rounds} rounds",
        header,
        _rows(hopped, HOP_CLIENT, metrics),
    )

    hop_wall = median(searches[BLOCKING], "wall_us") - median(searches[AWAITED], "wall_us")
    hop_cpu = median(searches[BLOCKING], "cpu_us") - median(searches[AWAITED], "cpu_us")
    print(f"\nThe thread hop, per search: {hop_wall:+.0f} µs wall, {hop_cpu:+.0f} µs CPU")
    targets = Targets()
    bulk_ratio = ratio(median(bulk[BULK_BLOCKING], "rps"), median(bulk[BULK_AWAITED], "rps"))
    targets.add(Target(f"{BULK_BLOCKING} req/s vs {BULK_AWAITED}", bulk_ratio, 0.97))
    targets.print()
    print_environment(command_line("sync", argv))
    write_json(
        args.json,
        {
            "rounds": rounds,
            "searches": {
                name: {m: median(runs, m) for m in metrics} for name, runs in searches.items()
            },
            "bulk": {name: median(runs, "rps") for name, runs in bulk.items()},
            "bulk_rps_samples": {name: [r["rps"] for r in runs] for name, runs in bulk.items()},
            "search_wall_samples": {
                name: [r["wall_us"] for r in runs] for name, runs in searches.items()
            },
            "hops": {name: {m: median(runs, m) for m in metrics} for name, runs in hopped.items()},
            "hop_per_search_us": {"wall": hop_wall, "cpu": hop_cpu},
            "targets": targets.as_json(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
