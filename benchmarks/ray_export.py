"""Exporting extraction results through Ray Data: 1 actor against 2, on this machine.

    python -m benchmarks.ray_export [--ids 4000] [--concurrency 16] [--latency 0.05]
                                    [--quota 100000] [--rounds 3] [--quick] [--json PATH]

Needs the ``ray`` extra (``pip install -e '.[ray]'``) and the ``cli`` extra (the emulator is
started as ``asyncsearch serve`` in a child process on 127.0.0.1, with ``--latency`` seconds
added to every extraction answer through its fault settings, so the actors wait on the network
as they would on a real service). Each variant sends the same ``--ids`` seeded job ids through
``Dataset.map_batches(FetchExtractions, compute=ActorPoolStrategy(size=n), num_cpus=0.25)`` and
reads every row back; variants run in interleaved rounds and the medians are reported. A third
variant runs the 2 actors under one ``SharedRateLimit(--quota)``, far above what they reach: what
its leases cost (each actor leases tokens from the quota's actor a second's worth at a time).

Reported per variant: ids per second while fetching (from the first batch an actor starts to
the last one it finishes: Ray's start of the actors, a few seconds, is left out but shown in the
wall time), and the peak resident memory of each actor process (``ru_maxrss``, which
includes the Ray worker's own baseline of a few hundred MB), with the ratio of 2 actors to 1.

What one 2-core machine can and cannot show: here the emulator, Ray's driver, raylet and object
store, and the actors share two cores. With network latency the actors spend their time waiting,
so a second actor doubles the requests in flight and the ids/s scale with it until those cores
are busy: this shows that the transform keeps ``concurrency`` requests in flight per actor and
that actors add up. It cannot show how far this scales on a cluster (where each actor has cores
and a network of its own and the service is remote), nor a CPU-bound speed-up: with no latency
the emulator and the actors compete for the same two cores, and a second actor gains little.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchmarks._common import (
    Measurement,
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

API_KEY = "bench-key"
SEED = 11
#: The variant of 2 actors under one SharedRateLimit set far above what they reach (issue 48).
SHARED = "2 actors, shared quota"


class _Emulator:
    """``asyncsearch serve`` in a child process on a free loopback port."""

    def __init__(self, n_jobs: int) -> None:
        self.n_jobs = n_jobs
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> _Emulator:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncsearch",
                "serve",
                "--port",
                "0",
                "--api-key",
                API_KEY,
                "--seed",
                str(SEED),
                "--resources",
                "1",
                "--jobs",
                str(self.n_jobs),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("asyncsearch emulator listening on "):
                self.base_url = line.split()[-1]
                break
        if not self.base_url:
            self.__exit__()
            raise RuntimeError("asyncsearch serve did not start")
        return self

    def control(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Api-Key": API_KEY},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def _seeded_job_ids(n_jobs: int) -> list[str]:
    """The ids of the jobs ``serve --seed SEED --jobs n`` holds (the same seed, the same data)."""
    from asyncsearch.testing import ServiceEmulator

    emulator = ServiceEmulator(api_key=API_KEY, seed=SEED, n_resources=1, n_jobs=n_jobs)
    return [job["id"] for job in emulator.jobs()]


def _measured_class() -> type:
    """``FetchExtractions`` that also reports its process id and peak memory in each batch."""
    import pyarrow as pa

    from asyncsearch.ray import FetchExtractions

    class MeasuredFetchExtractions(FetchExtractions):
        async def __call__(self, batch: Any) -> Any:
            started = time.time()
            table = await super().__call__(batch)
            extra = {
                "pid": os.getpid(),
                "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "started": started,
                "ended": time.time(),
            }
            for name, value in extra.items():
                table = table.append_column(name, pa.array([value] * len(table)))
            return table

    return MeasuredFetchExtractions


def _export(
    ray: Any,
    measured: type,
    ids: list[str],
    *,
    base_url: str,
    actors: int,
    concurrency: int,
    quota: float | None = None,
) -> Measurement:
    options: dict[str, Any] = {}
    if quota is not None:
        from asyncsearch.ray import SharedRateLimit

        options["rate_limit"] = SharedRateLimit(quota)  # a quota of its own for each run
    dataset = ray.data.from_items([{"job_id": i} for i in ids], override_num_blocks=16)
    results = dataset.map_batches(
        measured,
        fn_constructor_kwargs={
            "api_key": API_KEY,
            "base_url": base_url,
            "concurrency": concurrency,
            **options,
        },
        batch_size=200,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=0.25,
    )
    rows = errors = 0
    peaks: dict[int, int] = {}
    first, last = float("inf"), 0.0
    start = time.perf_counter()
    for batch in results.iter_batches(batch_format="pyarrow", batch_size=None):
        rows += len(batch)
        errors += len(batch) - batch["error"].null_count
        for pid, peak in zip(batch["pid"].to_pylist(), batch["peak_kb"].to_pylist(), strict=True):
            peaks[pid] = max(peaks.get(pid, 0), peak)
        first = min(first, *batch["started"].to_pylist())
        last = max(last, *batch["ended"].to_pylist())
    wall = time.perf_counter() - start
    if rows != len(ids) or errors:
        raise RuntimeError(f"the export lost ids or failed: {rows} rows, {errors} errors")
    return {
        # From the first batch an actor started to the last one it finished (one machine, one
        # clock): the fetching itself, without Ray's start of the actors.
        "ids_per_s": len(ids) / (last - first),
        "wall": wall,
        "actors_seen": float(len(peaks)),
        "peak_mb_per_actor": max(peaks.values()) / 1024,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=4000, help="job ids to export (default 4000)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests per actor")
    parser.add_argument(
        "--latency", type=float, default=0.05, help="seconds added to every answer (0.05)"
    )
    parser.add_argument(
        "--quota",
        type=float,
        default=100_000,
        help="per_second of the SharedRateLimit variant, far above what the actors reach",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for the smoke test")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.ids, args.rounds = 400, 1

    import ray
    import ray.cloudpickle

    # The measuring class is defined in this module: send it to the actors by value, so the
    # workers need not import ``benchmarks``.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        ids = _seeded_job_ids(args.ids)
        measured = _measured_class()
        with _Emulator(args.ids) as emulator:
            if args.latency:
                emulator.control(
                    "/_emulator/faults", {"endpoint": "extract", "latency": args.latency}
                )

            def variant(actors: int, quota: float | None = None) -> Measurement:
                return _export(
                    ray,
                    measured,
                    ids,
                    base_url=emulator.base_url,
                    actors=actors,
                    concurrency=args.concurrency,
                    quota=quota,
                )

            variants = {
                "1 actor": lambda: variant(1),
                "2 actors": lambda: variant(2),
                SHARED: lambda: variant(2, args.quota),
            }
            results = rounds_sync(variants, args.rounds)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if started_ray:
            ray.shutdown()

    one = median(results["1 actor"], "ids_per_s")
    rows = []
    for name, samples in results.items():
        rate = median(samples, "ids_per_s")
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                fmt_ratio(ratio(rate, one)),
                f"{median(samples, 'wall'):.2f}s",
                f"{median(samples, 'actors_seen'):g}",
                f"{median(samples, 'peak_mb_per_actor'):,.0f} MB",
            ]
        )
    print_table(
        f"{args.ids:,} ids, {args.concurrency} requests in flight per actor, "
        f"{args.latency * 1000:g} ms latency, median of {args.rounds} rounds",
        [
            "variant",
            "ids/s",
            "vs 1 actor",
            "wall (with actor start)",
            "actors",
            "peak RSS per actor",
        ],
        rows,
    )
    targets = Targets()
    scaling = ratio(median(results["2 actors"], "ids_per_s"), one)
    targets.add(
        Target(
            "2 actors >= 1.5x the ids/s of 1 actor (network-bound, one 2-core machine)",
            scaling,
            1.5,
            note="shows actors adding up while they wait; not cluster scaling",
        )
    )
    shared = ratio(median(results[SHARED], "ids_per_s"), median(results["2 actors"], "ids_per_s"))
    targets.add(
        Target(
            f"2 actors under a SharedRateLimit({args.quota:g}) >= 0.95x the ids/s without one",
            shared,
            0.95,
            note="the leases' cost: the quota is far above what the actors reach",
        )
    )
    targets.print()
    print_environment(command_line("ray_export", argv))
    write_json(
        args.json,
        {
            "benchmark": "ray_export",
            "ids": args.ids,
            "concurrency": args.concurrency,
            "latency": args.latency,
            "results": results,
            "targets": targets.as_json(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
