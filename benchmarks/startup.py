"""Start-up costs: ``import asyncsearch`` in a fresh interpreter, and making a client.

    python -m benchmarks.startup [--rounds 15] [--quick] [--json PATH]

Import time is measured the way a user meets it: the wall time of ``python -c "import X"`` in a
fresh interpreter minus that of ``python -c "pass"``, medians over interleaved rounds, after one
untimed run of each that leaves the bytecode caches written. ``import aiohttp`` is the baseline
(asyncsearch cannot import faster than its transport); ``import httpx, pydantic`` is what a
generated SDK starts with. ``-X importtime`` then shows where asyncsearch's own time goes.

Construction times are medians per call of making and closing
``AsyncSearchClient(api_key=, base_url=)`` (no session is made until the first request) against
``aiohttp.ClientSession()`` and ``httpx.AsyncClient()``, all inside a running event loop.

It also checks that ``import asyncsearch`` imports none of numpy, rich, the CLI
(``asyncsearch._cli``) or the emulator (``asyncsearch.testing``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
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

IMPORTS = {
    "bare interpreter": "pass",
    "import aiohttp": "import aiohttp",
    "import asyncsearch": "import asyncsearch",
    "import httpx, pydantic": "import httpx, pydantic",
}
BASELINE = "import aiohttp"
FORBIDDEN = ("numpy", "rich", "asyncsearch._cli", "asyncsearch.testing", "pydantic", "httpx")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Users run with bytecode caches; without them every import compiles its source again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        env=_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )


def _spawn_timer(code: str) -> Callable[[], Measurement]:
    def run() -> Measurement:
        start = time.perf_counter()
        _python(code)
        return {"seconds": time.perf_counter() - start}

    return run


def importtime_breakdown() -> list[tuple[str, float]]:
    """Where ``import asyncsearch`` spends its time, from one ``-X importtime`` run (ms).

    A module is charged to the first package that imported it (asyncio is counted in aiohttp).
    """
    stderr = _python("import asyncsearch", "-X", "importtime").stderr
    records: list[tuple[str, int, int]] = []
    started = False
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line[12:].split("|"))
        if started:
            records.append((name, int(self_us), int(cumulative_us)))
        elif name == "site":
            started = True  # what comes before is the interpreter's own start-up
    cumulative = {name: total for name, _, total in records}
    total = cumulative.get("asyncsearch", 0)
    own = sum(own for name, own, _ in records if name.split(".")[0] == "asyncsearch")
    rows = [("import asyncsearch, in all", total / 1000)]
    rest = total - own
    for package in ("aiohttp", "anyio", "msgspec"):
        if package in cumulative:
            rows.append((f"  {package} (with what it imports first)", cumulative[package] / 1000))
            rest -= cumulative[package]
        if package == "aiohttp" and "aiohttp.connector" in cumulative:
            # Its module body builds aiohttp's default SSL contexts (loading the CA bundle).
            connector = next(own for name, own, _ in records if name == "aiohttp.connector")
            rows.append(("    of which aiohttp.connector's own module body", connector / 1000))
    rows.append(("  asyncsearch's own modules", own / 1000))
    rows.append(("  the rest (stdlib modules asyncsearch imports first)", rest / 1000))
    return rows


def imported_modules() -> list[str]:
    """Every module in ``sys.modules`` after ``import asyncsearch`` in a fresh interpreter."""
    out = _python("import sys, json, asyncsearch; print(json.dumps(sorted(sys.modules)))").stdout
    modules: list[str] = json.loads(out)
    return modules


def construction_times(rounds: int, batch: int) -> dict[str, float]:
    """Median seconds per construction, for the SDK client and two bare HTTP clients.

    Each round makes a batch of each kind in turn (one at a time, interleaving single calls
    would charge one client for the memory another one just freed: httpx loads the system's CA
    certificates every time), and the figure is the median over rounds of each batch's median.
    """

    async def measure() -> dict[str, float]:
        import aiohttp
        import httpx

        from asyncsearch import AsyncSearchClient

        async def sdk() -> None:
            await AsyncSearchClient(api_key="bench-key", base_url="http://127.0.0.1:9").aclose()

        async def bare() -> None:
            await aiohttp.ClientSession().close()

        async def generated() -> None:
            await httpx.AsyncClient().aclose()

        kinds = {
            "AsyncSearchClient(api_key=, base_url=)": (sdk, batch),
            "aiohttp.ClientSession()": (bare, batch),
            "httpx.AsyncClient()": (generated, max(3, batch // 50)),
        }
        medians: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(rounds):
            for name, (make, count) in kinds.items():
                samples = []
                for _ in range(count):
                    start = time.perf_counter()
                    await make()
                    samples.append(time.perf_counter() - start)
                medians[name].append(statistics.median(samples))
        return {name: statistics.median(values) for name, values in medians.items()}

    return asyncio.run(measure())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.startup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rounds = 1 if args.quick else max(5, args.rounds)  # --quick: a smoke test, in seconds

    if not args.quick:  # a smoke test's figures mean nothing: it skips the warm-up spawns
        for code in IMPORTS.values():  # writes the bytecode caches; not timed
            _python(code)
    samples = rounds_sync({name: _spawn_timer(code) for name, code in IMPORTS.items()}, rounds)
    bare = median(samples["bare interpreter"], "seconds")
    import_ms = {name: (median(samples[name], "seconds") - bare) * 1000 for name in IMPORTS}
    rows = [
        [
            name,
            f"{median(samples[name], 'seconds') * 1000:.0f}",
            f"{import_ms[name]:.0f}" if name != "bare interpreter" else "-",
            fmt_ratio(ratio(import_ms[name], import_ms[BASELINE]))
            if name != "bare interpreter"
            else "-",
        ]
        for name in IMPORTS
    ]
    print_table(
        f"Import in a fresh interpreter, median of {rounds} interleaved rounds; "
        f"ratio to {BASELINE}",
        ["python -c", "process ms", "import ms (minus bare)", "vs import aiohttp"],
        rows,
    )

    breakdown = importtime_breakdown()
    print_table(
        "Where the import time goes: python -X importtime -c 'import asyncsearch' (one run)",
        ["part", "ms"],
        [[name, f"{ms:.1f}"] for name, ms in breakdown],
    )

    construct = construction_times(rounds, 20 if args.quick else 200)
    sdk = construct["AsyncSearchClient(api_key=, base_url=)"]
    print_table(
        "Making and closing a client (inside a running loop, before any request), median per call",
        ["constructor", "µs", "vs AsyncSearchClient"],
        [[name, f"{s * 1e6:.1f}", fmt_ratio(ratio(s, sdk))] for name, s in construct.items()],
    )

    modules = imported_modules()
    found = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    targets = Targets()
    targets.add(
        Target(
            "import asyncsearch time vs import aiohttp (its floor)",
            ratio(import_ms["import asyncsearch"], import_ms[BASELINE]),
            1.5,
            higher_is_better=False,
            note="informational: no target was set",
        )
    )
    targets.print()
    verdict = "PASS" if not found else "MISS"
    print(
        f"{verdict} import asyncsearch imports none of {', '.join(FORBIDDEN)}"
        + (f": found {', '.join(found)}" if found else f" ({len(modules)} modules in all)")
    )
    print()
    print_environment(command_line("startup", argv))
    results: dict[str, Any] = {
        "import_ms": import_ms,
        "construct_seconds": construct,
        "forbidden_found": found,
        "modules": len(modules),
        "targets": targets.as_json(),
        "breakdown": breakdown,
    }
    write_json(args.json, {"benchmark": "startup", **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
