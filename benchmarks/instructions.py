"""Instructions per request of the bulk path, counted by callgrind: a figure load cannot move.

    python -m benchmarks.instructions [--variants gather,bare-read] [--small 500] [--large 1500]
                                      [--concurrency 64] [--rounds 1] [--jobs 1] [--quick]
                                      [--json PATH]

The CPU time ``benchmarks.fanout`` reports moves by several percent between runs of the same
code on a shared machine (``benchmarks/README.md``); the number of instructions a request takes
does not. A benchmark server (``benchmarks._server``, no latency) runs natively in a separate
process; each variant's client runs in a fresh interpreter under ``valgrind --tool=callgrind``,
once fetching ``--small`` jobs and once ``--large``, ``--concurrency`` in flight, the same code
as ``benchmarks.fanout``'s variants. Everything a run does once (interpreter start, imports, the
session and its first connections, the client's construction) is in both counts, so

    instructions per request = (I(large) - I(small)) / (large - small)

is the steady-state cost of one request in the client process, what the last section of
``benchmarks/README.md`` calls "callgrind, 1,500 minus 500 requests". Variants (``--variants``):

- ``gather``: ``client.gather_extractions(ids, concurrency=64)``, a client with its defaults;
- ``iter``: ``async for result in client.iter_extractions(...)``;
- ``calls``: one ``client.get_extraction`` per id, 64 in flight under a semaphore of the caller's;
- ``bare-read`` (the baseline): one ``aiohttp.ClientSession``, 64 workers, ``msgspec``, with the
  SDK's read timeout (``sock_read=60``), as ``benchmarks.fanout``'s targets use it;
- ``bare``: the same without the read timeout.

Ratios are taken against ``bare-read`` counted in the same run. The interpreter runs with
``PYTHONHASHSEED=0``; three rounds on af08cab gave per request 599.26k-599.28k (``gather``),
500.08k-500.18k (``bare-read``) and 718.1k-718.7k (``calls``): one round tells apart changes
of a few hundred instructions (``--rounds`` takes the median of several). Under
callgrind Python runs ~50x slower: the defaults take about 70 s with ``--jobs 2`` (two children
at once; counts do not depend on load) on a 2-core Xeon. Each child checks that it imports the
tree's own ``asyncsearch``, and the tree measured (``git describe --dirty``) is printed. ``--quick``
(the smoke test) runs without valgrind, 20 and 60 requests, and reports CPU microseconds per
request instead: it checks the plumbing, not the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import (
    REPO,
    ServerProcess,
    Target,
    Targets,
    command_line,
    fmt_ratio,
    print_environment,
    print_table,
    ratio,
    run_loop,
    write_json,
)

BASELINE = "bare-read"

#: What each variant runs: the function of ``benchmarks.fanout`` and its description.
VARIANTS: dict[str, tuple[str, str]] = {
    "gather": ("sdk_gather", "asyncsearch gather_extractions"),
    "iter": ("sdk_iter", "asyncsearch iter_extractions"),
    "calls": ("sdk_calls", "asyncsearch get_extraction calls"),
    "bare-read": ("bare_bounded_read_timeout", "bare aiohttp + msgspec, sock_read=60"),
    "bare": ("bare_bounded", "bare aiohttp + msgspec"),
}

#: What issue 45 holds the tree to: af08cab's instructions per request, plus 1%, as a ratio to
#: the bare loop's counted in the same run (so that it holds on another machine). Counted by
#: this script on af08cab (2-core Xeon, CPython 3.11.7, aiohttp 3.13.5): 599.3k against 500.1k.
AF08CAB_RATIO = 599.3 / 500.1


# ---------------------------------------------------------------------------------------------
# The child: one variant, one number of requests, in a fresh interpreter
# ---------------------------------------------------------------------------------------------


def _child(variant: str, base_url: str, requests: int, concurrency: int) -> int:
    """Fetch ``requests`` jobs with ``variant``; print what was fetched and the CPU time."""
    import asyncsearch
    from benchmarks import fanout

    # The tree's own asyncsearch, not an installed copy: the figure is the tree's.
    if not Path(asyncsearch.__file__).resolve().is_relative_to(REPO):
        raise RuntimeError(f"asyncsearch was imported from {asyncsearch.__file__}, not {REPO}")

    fetch: Callable[[str, list[str], int], Awaitable[int]] = getattr(fanout, VARIANTS[variant][0])
    ids = fanout.job_ids(requests)
    cpu = time.process_time()
    got = run_loop(fetch(base_url, ids, concurrency))
    cpu = time.process_time() - cpu
    print(json.dumps({"got": got, "cpu": cpu}), flush=True)
    return 0 if got == requests else 1


# ---------------------------------------------------------------------------------------------
# The parent: runs the children, under callgrind or not
# ---------------------------------------------------------------------------------------------


def _tree() -> str:
    """The tree measured: its path and ``git describe --always --dirty`` (a figure names it)."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        described = "not a git checkout"
    return f"{REPO} ({described})"


def _callgrind_total(path: Path) -> int:
    """The instructions a callgrind output file counts (its ``summary:`` or ``totals:`` line)."""
    totals = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            totals = int(line.split()[1])
    if totals is None:
        raise RuntimeError(f"no totals in {path}")
    return totals


def _count(
    variant: str, requests: int, args: argparse.Namespace, base_url: str, workdir: Path
) -> float:
    """One child's count: instructions (under callgrind), or CPU µs (with ``--quick``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONHASHSEED"] = "0"
    env.pop("PYTHONASYNCIODEBUG", None)
    child = [
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        variant,
        "--base-url",
        base_url,
        "--requests",
        str(requests),
        "--concurrency",
        str(args.concurrency),
    ]
    out = None
    if not args.quick:
        fd, name = tempfile.mkstemp(prefix=f"callgrind.{variant}.{requests}.", dir=workdir)
        os.close(fd)
        out = Path(name)
        child = [
            args.valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--quiet",
            *child,
        ]
    done = subprocess.run(child, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    report = done.stdout.strip().splitlines()
    if done.returncode != 0 or not report:
        raise RuntimeError(
            f"the {variant} client ({requests} requests) failed with exit code "
            f"{done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    result = json.loads(report[-1])
    if out is None:
        return float(result["cpu"]) * 1e6
    return float(_callgrind_total(out))


def _run(args: argparse.Namespace, base_url: str) -> dict[str, dict[str, Any]]:
    """Count every (variant, size, repetition), ``--jobs`` at a time; the figures per variant."""
    plan = [
        (variant, size, rep)
        for rep in range(args.rounds)
        for variant in args.variants
        for size in (args.small, args.large)
    ]
    with tempfile.TemporaryDirectory(prefix="asyncsearch-callgrind-") as tmp:
        workdir = Path(tmp)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                key: pool.submit(_count, key[0], key[1], args, base_url, workdir) for key in plan
            }
            counts = {key: future.result() for key, future in futures.items()}
    results: dict[str, dict[str, Any]] = {}
    span = args.large - args.small
    for variant in args.variants:
        per_request = [
            (counts[variant, args.large, rep] - counts[variant, args.small, rep]) / span
            for rep in range(args.rounds)
        ]
        results[variant] = {
            "small": [counts[variant, args.small, rep] for rep in range(args.rounds)],
            "large": [counts[variant, args.large, rep] for rep in range(args.rounds)],
            "per_request": per_request,
            "median": statistics.median(per_request),
        }
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--variants",
        default=f"gather,{BASELINE}",
        help=f"comma-separated, of {', '.join(VARIANTS)} ({BASELINE} is always added)",
    )
    parser.add_argument("--small", type=int, default=500, help="requests of the smaller run")
    parser.add_argument("--large", type=int, default=1500, help="requests of the larger run")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=1, help="counts of each (median)")
    parser.add_argument("--jobs", type=int, default=1, help="children run at once")
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind executable")
    parser.add_argument(
        "--quick", action="store_true", help="no valgrind, few requests: a smoke test"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    # The child's side, run by the parent under callgrind.
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        return _child(args.child, args.base_url, args.requests, args.concurrency)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        _parser().error(f"unknown variants {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    args.variants = list(dict.fromkeys([*variants, BASELINE]))
    if args.quick:
        args.small, args.large, args.rounds = 20, 60, 1
    if not 0 < args.small < args.large:
        _parser().error("--small must be positive and below --large")
    args.rounds, args.jobs = max(1, args.rounds), max(1, args.jobs)
    if not args.quick and shutil.which(args.valgrind) is None:
        print(
            f"{args.valgrind} was not found: install valgrind (apt-get install valgrind), "
            "or pass --quick for a run without it",
            file=sys.stderr,
        )
        return 2

    with ServerProcess("--pages", "1", "--page-size", "1") as server:
        results = _run(args, server.base_url)

    unit = "CPU µs" if args.quick else "instructions"
    base = results[BASELINE]["median"]
    rows = []
    for variant, result in results.items():
        spread = result["per_request"]
        figure = f"{result['median']:.1f}" if args.quick else f"{result['median'] / 1000:,.1f}k"
        rows.append(
            [
                VARIANTS[variant][1],
                f"{result['small'][0]:,.0f}",
                f"{result['large'][0]:,.0f}",
                figure,
                "-" if len(spread) < 2 else f"{(max(spread) - min(spread)) / 1000:.2f}k",
                fmt_ratio(ratio(result["median"], base)),
            ]
        )
    counter = "CPU time, no valgrind (--quick)" if args.quick else "callgrind"
    print_table(
        f"{unit[0].upper()}{unit[1:]} per request of the client process ({counter}): "
        f"({args.large:,} - {args.small:,} requests) / {args.large - args.small:,}, "
        f"{args.concurrency} in flight, no server latency, median of {args.rounds}; "
        f"ratios to {VARIANTS[BASELINE][1]}",
        [
            "client",
            f"{unit}, {args.small:,} req (first run)",
            f"{unit}, {args.large:,} req (first run)",
            f"{unit} / request",
            "spread (max - min)",
            "vs baseline",
        ],
        rows,
    )
    targets = Targets()
    if "gather" in results:
        targets.add(
            Target(
                f"gather_extractions {unit} per request vs {VARIANTS[BASELINE][1]}",
                ratio(results["gather"]["median"], base),
                round(AF08CAB_RATIO * 1.01, 2),
                higher_is_better=False,
                note="issue 45: within 1% of af08cab's 599.3k against 500.1k"
                + (" (CPU time: not the figure)" if args.quick else ""),
            )
        )
    targets.print()
    print(f"tree: {_tree()}")
    print_environment(command_line("instructions", argv))
    payload = {
        "benchmark": "instructions",
        "unit": unit,
        "small": args.small,
        "large": args.large,
        "concurrency": args.concurrency,
        "variants": {VARIANTS[v][1]: r for v, r in results.items()},
        "targets": targets.as_json(),
        "tree": _tree(),
    }
    write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
