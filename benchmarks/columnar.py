"""Search hits with embeddings into columns: ``asyncsearch.arrow.search_table`` against hand loops.

    python -m benchmarks.columnar [--hits 10000] [--page-size 100] [--rounds 7] [--quick]
                                  [--json PATH]

The bundled emulator (``asyncsearch serve``) runs in a separate process with ``--hits``
resources, each with 512 + 768 embedding values, and every variant walks all of them (a search
with empty filters, ``--page-size`` hits per page) into something a notebook or a vector store
takes:

- ``asyncsearch.arrow search_table``: one ``pyarrow.Table``, built page by page into record
  batches (the vectors as ``fixed_size_list<float32>``, null where a hit has none);
- ``list of dicts``: ``hit.to_dict()`` for every hit of ``client.search_hits`` (the wire form,
  vectors as lists of Python floats), what a loop feeding pandas would keep;
- ``hand loop, search_pages + embedding_matrix`` (the baseline): a loop over
  ``client.search_pages`` that keeps the same scalar fields as ``search_table`` in lists and
  each page's ``embedding_matrix`` per vector, then ``pyarrow.Table.from_arrays`` with the
  matrices concatenated (NaN rows where a hit has no vector: no nulls).

Each variant runs in a child process of its own, once per round (rounds interleaved, order
rotated), so that its memory is its own: "peak MB" is how much the child's peak resident memory
(``ru_maxrss``) grew during the walk, after imports and a one-hit warm-up request. Reported:
wall and CPU time of the walk, peak memory, the size of the result (``Table.nbytes``; for the
list of dicts, the size of the same table), medians over the rounds, ratios to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import (
    REPO,
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
TABLE = "asyncsearch.arrow search_table"
DICTS = "list of dicts"
HAND = "hand loop, search_pages + embedding_matrix"
VARIANTS = (TABLE, DICTS, HAND)
#: What search_table may hold besides its table: the page being decoded, the next one in
#: flight and its body (2.5 MB each at 100 hits), the interpreter's arenas.
MEMORY_CONSTANT_MB = 32.0


# ---------------------------------------------------------------------------------------------
# The variants, run in a child process (python -m benchmarks.columnar --child VARIANT ...)
# ---------------------------------------------------------------------------------------------


async def _table(client: Any, hits: int, page_size: int) -> Any:
    from asyncsearch.arrow import search_table

    return await search_table(client, filters={}, page_size=page_size, max_items=hits)


async def _dicts(client: Any, hits: int, page_size: int) -> Any:
    async with client.search_hits(filters={}, page_size=page_size, max_items=hits) as walk:
        return [hit.to_dict() async for hit in walk]


async def _hand(client: Any, hits: int, page_size: int) -> Any:
    import numpy as np
    import pyarrow as pa

    from asyncsearch.arrow import HIT_COLUMNS

    # The same columns as search_table's, as a loop written for them would make them.
    names = [name for name, _ in HIT_COLUMNS]
    columns: dict[str, list[Any]] = {name: [] for name in names}
    matrices: dict[str, list[Any]] = {"small3_512": [], "clip2": []}
    async with client.search_pages(
        filters={}, page_size=page_size, max_pages=-(-hits // page_size)
    ) as pages:
        async for page in pages:
            for name in names:
                columns[name].extend(getattr(hit, name) for hit in page.hits)
            for vector in matrices:
                matrices[vector].append(page.embedding_matrix(vector))
    arrays = [pa.array(columns[name], kind) for name, kind in HIT_COLUMNS]
    for parts in matrices.values():
        matrix = np.concatenate(parts)
        flat = pa.array(matrix.reshape(-1))
        arrays.append(pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1]))
    return pa.Table.from_arrays(arrays, names=[*names, *matrices])


def _child(variant: str, base_url: str, hits: int, page_size: int) -> None:
    # Imported before anything is measured, in every variant alike (pyarrow alone is ~50 MB).
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401

    import asyncsearch.arrow  # noqa: F401
    from asyncsearch import AsyncSearchClient

    walk = {TABLE: _table, DICTS: _dicts, HAND: _hand}[variant]

    async def main() -> Measurement:
        async with AsyncSearchClient(API_KEY, base_url=base_url) as client:
            await client.search(filters={}, page_size=1)  # connection, imports, caches
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            wall, cpu = time.perf_counter(), time.process_time()
            result = await walk(client, hits, page_size)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rows = len(result) if isinstance(result, list) else result.num_rows
            size = 0.0 if isinstance(result, list) else float(result.nbytes)
            return {
                "wall_s": wall,
                "cpu_s": cpu,
                "peak_mb": (peak - before) / 1024,  # ru_maxrss is in kB on Linux
                "table_mb": size / 1e6,
                "rows": float(rows),
            }

    print(json.dumps(asyncio.run(main())))


# ---------------------------------------------------------------------------------------------
# The parent: the emulator, the rounds, the report
# ---------------------------------------------------------------------------------------------


class _Emulator:
    """``python -m asyncsearch serve`` with ``hits`` resources, in a child process."""

    def __init__(self, hits: int) -> None:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncsearch",
                "serve",
                "--port",
                "0",
                "--resources",
                str(hits),
                "--jobs",
                "0",
                "--api-key",
                API_KEY,
                "--seed",
                "1",
            ],
            cwd=REPO,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self._proc.stdout is not None
        seen = ""
        while True:
            line = self._proc.stdout.readline().decode()
            if not line:
                self.stop()
                raise RuntimeError(f"the emulator did not start (it said {seen!r})")
            seen += line
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.base_url = found.group(1)
                return

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONASYNCIODEBUG", None)
    return env


def _run_child(variant: str, base_url: str, hits: int, page_size: int) -> Measurement:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.columnar",
            "--child",
            variant,
            "--base-url",
            base_url,
            "--hits",
            str(hits),
            "--page-size",
            str(page_size),
        ],
        cwd=REPO,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{done.stderr}")
    measured: Measurement = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.columnar", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--hits", type=int, default=10_000, help="hits walked by each variant")
    parser.add_argument("--page-size", type=int, default=100, help="hits per page")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 3)")
    parser.add_argument("--quick", action="store_true", help="few hits, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        _child(args.child, args.base_url, args.hits, args.page_size)
        return 0
    args.rounds = max(3, args.rounds)
    if args.quick:  # a smoke test: one round over a few hits, in seconds
        args.hits, args.rounds = 100, 1
    emulator = _Emulator(args.hits)
    try:
        samples = rounds_sync(
            {
                name: (
                    lambda name=name: _run_child(name, emulator.base_url, args.hits, args.page_size)
                )
                for name in VARIANTS
            },
            args.rounds,
        )
    finally:
        emulator.stop()

    base_wall = median(samples[HAND], "wall_s")
    base_peak = median(samples[HAND], "peak_mb")
    table_mb = median(samples[TABLE], "table_mb")
    rows = []
    results: dict[str, Any] = {"variants": {}, "rounds": args.rounds, "hits": args.hits}
    for name in VARIANTS:
        runs = samples[name]
        wall, cpu, peak = (median(runs, m) for m in ("wall_s", "cpu_s", "peak_mb"))
        assert all(run["rows"] == args.hits for run in runs), f"{name} lost hits"
        rows.append(
            [
                name,
                f"{int(runs[0]['rows']):,}",
                f"{wall * 1000:,.0f}",
                fmt_ratio(ratio(wall, base_wall)),
                f"{cpu * 1000:,.0f}",
                f"{peak:,.1f}",
                fmt_ratio(ratio(peak, base_peak)),
            ]
        )
        results["variants"][name] = {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak}
    print_table(
        f"{args.hits:,} hits with embeddings (512 + 768 values each) from the emulator in another "
        f"process, pages of {args.page_size}; median of {args.rounds} interleaved rounds, each "
        f"variant in a child process; the table is {table_mb:.1f} MB; ratios to {HAND}",
        ["variant", "hits", "wall ms", "time vs baseline", "CPU ms", "peak MB", "peak vs baseline"],
        rows,
    )
    table = results["variants"][TABLE]
    targets = Targets()
    targets.add(
        Target(
            f"search_table wall time vs {HAND}",
            ratio(table["wall_s"], base_wall),
            1.0,
            higher_is_better=False,
        )
    )
    targets.add(
        Target(
            f"search_table peak memory vs 3 x its table + {MEMORY_CONSTANT_MB:g} MB",
            ratio(table["peak_mb"], 3 * table_mb + MEMORY_CONSTANT_MB),
            1.0,
            higher_is_better=False,
            note=(
                f"{table['peak_mb']:.1f} MB against 3 x {table_mb:.1f} MB"
                f" + {MEMORY_CONSTANT_MB:g} MB"
            ),
        )
    )
    targets.print()
    print_environment(command_line("columnar", argv))
    results["targets"] = targets.as_json()
    results["table_mb"] = table_mb
    write_json(args.json, {"benchmark": "columnar", **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
