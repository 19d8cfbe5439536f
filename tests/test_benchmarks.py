"""Smoke test of the benchmark scripts in ``benchmarks/``: each one runs to the end with --quick.

It runs in the default suite, so that a change to the SDK that breaks a script fails CI instead
of being found the next time someone wants numbers. No figure is asserted (timed assertions in
tests are flaky, and ``--quick`` is too short to mean anything): only that each script printed a
result table with ratios, its PASS/MISS target lines, the machine and library versions, and
left no server process behind. Skipped when the benchmark baselines (the ``bench`` extra) are
not installed.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

#: The dev extra leaves the baselines out (they are heavy and only the benchmarks use them);
#: CI runs this file in a step of its own after `pip install -e '.[bench]'`.
BENCH_ONLY = "the benchmarks' baselines are not installed: pip install -e '.[bench]' (CI does)"
for _baseline in ("pydantic", "httpx", "orjson", "numpy"):
    pytest.importorskip(_baseline, reason=BENCH_ONLY)


def _child_processes() -> set[int]:
    """Pids of this process's children that are still running or unreaped (Linux only)."""
    children: set[int] = set()
    for path in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        children.update(int(pid) for pid in path.read_text().split())
    return children


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "script",
    ["columnar", "decode", "fanout", "instructions", "key_provider", "paging", "startup", "sync"],
)
def test_benchmark_script_runs_quick(
    script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"benchmarks.{script}")
    before = _child_processes()

    assert module.main(["--quick", "--json", str(tmp_path / f"{script}.json")]) == 0

    out = capsys.readouterr().out
    assert re.search(r"^\| .+ \|$", out, flags=re.MULTILINE), "no result table printed"
    assert re.search(r"\b\d+\.\d\dx\b", out), "no ratio printed"
    assert re.search(r"^\s*(PASS|MISS) ", out, flags=re.MULTILINE), "no target line printed"
    assert "machine: " in out
    assert "libraries: asyncsearch " in out
    assert (tmp_path / f"{script}.json").stat().st_size > 0
    assert _child_processes() <= before, "a benchmark server process was left running"


@pytest.mark.timeout(120)
def test_chart_draws_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import chart, paging

    results = tmp_path / "paging.json"
    assert paging.main(["--quick", "--json", str(results)]) == 0
    output = tmp_path / "results.png"

    assert chart.main([str(results), "-o", str(output)]) == 0

    assert output.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "wrote" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_the_benchmark_server_sends_a_request_id_only_when_asked() -> None:
    """``benchmarks.instructions --request-id`` counts the client's work on each answer's
    ``X-Request-Id`` (the service's answers carry one): the server must send it, a new one for
    each answer, and none without the flag."""
    import urllib.request

    from benchmarks._common import ServerProcess

    job = "/v2/extract/00000000-0000-4000-8000-000000000001"
    for flags, expect in ((("--request-id",), True), ((), False)):
        with ServerProcess(*flags) as server:
            ids = []
            for _ in range(2):
                with urllib.request.urlopen(server.base_url + job, timeout=10) as answer:
                    assert answer.status == 200
                    ids.append(answer.headers.get("X-Request-Id"))
        if expect:
            assert None not in ids
            assert ids[0] != ids[1]
        else:
            assert ids == [None, None]
