"""An async key provider that takes 20 ms a question, against a key given as a string.

    python -m benchmarks.key_provider [--requests 640] [--concurrency 64] [--provider-ms 20]
                                      [--rounds 7] [--quick] [--json PATH]

Issue 45's measure, as it was taken: a bulk call of ``--requests`` ids at ``--concurrency``
against a loopback ``aiohttp.web`` server (in a process of its own, answering each
``GET /v2/extract/{id}`` at once with a ~3 KB job). Every id is a call of its own that asks the
provider for its key before it is sent; calls that ask while a question is in flight take its
answer. Before, each call's question waited for every other call's: 640 ids took 15.1 s against
0.6 s with a string key. The target: at most 1.5 times the string key's time, plus 0.1 s.
Interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from asyncsearch import AsyncSearchClient
from benchmarks._bodies import job_body
from benchmarks._common import (
    REPO,
    Measurement,
    Target,
    Targets,
    command_line,
    median,
    print_environment,
    print_table,
    rounds_async,
    run_loop,
    write_json,
)
from benchmarks.fanout import job_ids

API_KEY = "bench-key"


async def _server() -> web.AppRunner:
    """An aiohttp.web app on a free loopback port, answering every job at once."""
    template = job_body("00000000-0000-4000-8000-000000000000")

    async def job(request: web.Request) -> web.Response:
        return web.Response(body=template, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v2/extract/{id}", job)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _serve() -> None:
    """The server process: the app until stdin closes."""

    async def main() -> None:
        runner = await _server()
        print(f"READY {runner.addresses[0][1]}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(main())


async def _in_process(runs: dict[str, Callable[[str], Awaitable[Measurement]]], rounds: int) -> Any:
    """The rounds against the app served in this process's own loop, as a test server is."""
    runner = await _server()
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        return await rounds_async({n: (lambda f=f: f(base_url)) for n, f in runs.items()}, rounds)
    finally:
        await runner.cleanup()


def _fetch(provider_ms: float | None) -> Callable[[str, list[str], int], Awaitable[Measurement]]:
    async def provider() -> str:
        await asyncio.sleep(provider_ms / 1000 if provider_ms else 0)  # a secrets manager
        return API_KEY

    async def fetch(base_url: str, ids: list[str], concurrency: int) -> Measurement:
        key: Any = API_KEY if provider_ms is None else provider
        started = time.perf_counter()
        async with AsyncSearchClient(api_key=key, base_url=base_url) as client:
            results = await client.gather_extractions(ids, concurrency=concurrency)
        wall = time.perf_counter() - started
        if not all(result.ok for result in results):
            raise RuntimeError("a fetch failed")
        return {"wall": wall}

    return fetch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.key_provider", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=640, help="ids of the bulk call")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--provider-ms", type=float, default=20.0, help="a question's time")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="serve from the client's own process and loop (as a test server does)",
    )
    parser.add_argument("--quick", action="store_true", help="few requests, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve()
        return 0
    if args.quick:
        args.requests, args.rounds = 40, 1
    ids = job_ids(args.requests)
    variants = {
        "a string key": _fetch(None),
        f"an async key provider ({args.provider_ms:g} ms)": _fetch(args.provider_ms),
    }
    runs = {
        name: (lambda base_url, fetch=fetch: fetch(base_url, ids, args.concurrency))
        for name, fetch in variants.items()
    }
    if args.in_process:
        samples = run_loop(_in_process(runs, args.rounds))
    else:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "benchmarks.key_provider", "--serve"]
        server = subprocess.Popen(
            command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert server.stdout is not None
            base_url = f"http://127.0.0.1:{int(server.stdout.readline().split()[1])}"
            by_url = {n: (lambda f=f: f(base_url)) for n, f in runs.items()}
            samples = run_loop(rounds_async(by_url, args.rounds))
        finally:
            for pipe in (server.stdin, server.stdout):
                if pipe is not None:
                    pipe.close()  # the server's end: it stops at the end of its stdin
            server.wait(timeout=10)
    keyed, provided = (median(samples[name], "wall") for name in variants)
    print_table(
        f"{args.requests} ids, {args.concurrency} in flight, against a loopback aiohttp.web "
        f"server in {'this process' if args.in_process else 'another process'}; median of "
        f"{args.rounds} interleaved rounds",
        ["api_key", "seconds"],
        [[name, f"{median(runs, 'wall'):.3f}"] for name, runs in samples.items()],
    )
    targets = Targets()
    targets.add(
        Target(
            f"time with the provider / (1.5 x the string key's + 0.1 s), {args.requests} ids",
            provided / (1.5 * keyed + 0.1),
            1.0,
            higher_is_better=False,
            note=f"{provided:.2f} s against {keyed:.2f} s",
        )
    )
    targets.print()
    print_environment(command_line("key_provider", argv))
    write_json(
        args.json,
        {"seconds": {"string": keyed, "provider": provided}, "targets": targets.as_json()},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
