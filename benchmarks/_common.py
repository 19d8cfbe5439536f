"""What the benchmark scripts share: interleaved rounds, medians, ratios, tables, the machine.

Every script measures its variants in interleaved rounds: round 1 runs each variant once, then
round 2 runs each again (in a rotated order), and so on, so that a slow minute of the machine
(another process, thermal throttling, a noisy neighbour) touches every variant alike. The
figures reported are medians over the rounds, and ratios are taken against a baseline measured
in the same run, never against numbers from another machine or another day.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "REPO",
    "Measurement",
    "ServerProcess",
    "Target",
    "Targets",
    "environment",
    "fmt_ratio",
    "library_versions",
    "machine",
    "median",
    "print_environment",
    "print_table",
    "ratio",
    "rounds_async",
    "rounds_sync",
    "run_loop",
    "write_json",
]

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")

#: A variant's figures for one round: metric name -> value (seconds, bytes, req/s, ...).
Measurement = dict[str, float]

_LIBRARIES = ("aiohttp", "msgspec", "anyio", "pydantic", "httpx", "orjson", "numpy", "uvloop")


# ---------------------------------------------------------------------------------------------
# The machine and the libraries
# ---------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, str]:
    """Cores, CPU model, Python and OS of this machine."""
    return {
        "cores": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": platform.platform(terse=True),
    }


def library_versions() -> dict[str, str]:
    """Versions of asyncsearch and of the libraries it is compared with ("-" if missing)."""
    import asyncsearch

    versions = {"asyncsearch": asyncsearch.__version__}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    return versions


def environment() -> dict[str, dict[str, str]]:
    return {"machine": machine(), "libraries": library_versions()}


def print_environment(command: str) -> None:
    """Print the command line, the machine and the library versions under a result table."""
    env = environment()
    m = env["machine"]
    print(f"command: {command}")
    print(f"machine: {m['cores']} cores, {m['cpu']}, {m['python']}, {m['os']}")
    print("libraries: " + ", ".join(f"{k} {v}" for k, v in env["libraries"].items()))


def command_line(script: str, argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python -m", f"benchmarks.{script}", *args])


# ---------------------------------------------------------------------------------------------
# Rounds, medians, ratios
# ---------------------------------------------------------------------------------------------


def _rotated(names: Sequence[str], shift: int) -> list[str]:
    shift %= max(1, len(names))
    return [*names[shift:], *names[:shift]]


def rounds_sync(
    variants: Mapping[str, Callable[[], Measurement]], rounds: int
) -> dict[str, list[Measurement]]:
    """Run every variant once per round, round-robin (rotating the order), ``rounds`` times."""
    results: dict[str, list[Measurement]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in _rotated(names, r):
            gc.collect()
            results[name].append(variants[name]())
    return results


async def rounds_async(
    variants: Mapping[str, Callable[[], Awaitable[Measurement]]], rounds: int
) -> dict[str, list[Measurement]]:
    """``rounds_sync`` for coroutine variants, all in the running event loop."""
    results: dict[str, list[Measurement]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in _rotated(names, r):
            gc.collect()
            results[name].append(await variants[name]())
    return results


def median(samples: Sequence[Measurement], metric: str) -> float:
    """The median of one metric over the rounds."""
    return statistics.median(sample[metric] for sample in samples)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline`` (inf when the baseline is 0)."""
    return value / baseline if baseline else float("inf")


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}x"


def run_loop(main: Awaitable[T], *, use_uvloop: bool = False) -> T:
    """Run a coroutine in a fresh event loop: plain asyncio, or uvloop when asked."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if use_uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a Markdown table (numbers right-aligned), ready to paste into a README."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    numeric = [
        all(_looks_numeric(str(row[i])) for row in rows) and bool(rows) for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).rjust(w) if num else str(c).ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if num else ("-" * (w + 2))
        for w, num in zip(widths, numeric, strict=True)
    )
    print(f"\n{title}\n")
    print(line(header))
    print(rule + "|")
    for row in rows:
        print(line(row))
    print()


def _looks_numeric(text: str) -> bool:
    stripped = text.rstrip("x%sMBkmµ/ ").replace(",", "").replace("~", "")
    try:
        float(stripped)
    except ValueError:
        return text in ("-", "")
    return True


@dataclass
class Target:
    """One target of the issue: a measured ratio against its threshold."""

    name: str
    measured: float
    threshold: float
    higher_is_better: bool = True
    note: str = ""

    @property
    def passed(self) -> bool:
        if self.higher_is_better:
            return self.measured >= self.threshold
        return self.measured <= self.threshold

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "PASS" if self.passed else "MISS"
        note = f" ({self.note})" if self.note else ""
        return (
            f"{verdict} {self.name}: {self.measured:.2f}x (target {op} {self.threshold:g}x){note}"
        )


@dataclass
class Targets:
    """The targets a script checks, printed as PASS/MISS lines."""

    items: list[Target] = field(default_factory=list)

    def add(self, target: Target) -> None:
        self.items.append(target)

    def print(self) -> None:
        print("Targets:")
        for target in self.items:
            print("  " + target.line())
        print()

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "measured": t.measured,
                "threshold": t.threshold,
                "higher_is_better": t.higher_is_better,
                "passed": t.passed,
                "note": t.note,
            }
            for t in self.items
        ]


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write the results (for ``benchmarks.chart``) when ``--json PATH`` was given."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "environment": environment()}
    target.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# The benchmark server, in its own process
# ---------------------------------------------------------------------------------------------


class ServerProcess:
    """``benchmarks._server`` running in a child process on 127.0.0.1.

    A server in the client's own process would share its CPU and its event loop: a blocking
    caller would stall it, and its work would count as the client's CPU time. The child exits
    when its stdin closes, so it cannot outlive this process even if ``stop()`` is never
    reached; ``stop()`` (and leaving the ``with`` block) terminates and reaps it.
    """

    def __init__(self, *args: str) -> None:
        self._args = args
        self._proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.pop("PYTHONASYNCIODEBUG", None)  # the server is not what is being tested
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._server", *self._args],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode().strip()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"the benchmark server did not start (it said {line!r})")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """Wall time (``perf_counter``) and this process's CPU time (``process_time``) of a block."""
    box: dict[str, float] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield box
    finally:
        box["wall"] = time.perf_counter() - wall
        box["cpu"] = time.process_time() - cpu
