"""Every code block of README.md runs, in order, against the bundled emulator (tests/readme.py).

The whole README is one test, so that random test order (pytest-randomly) and workers
(pytest-xdist) never split blocks that build on each other; a failure names the block's line.
"""

from __future__ import annotations

import importlib.util
import re
import unittest

import pytest
from sybil.example import SybilFailure

from tests.readme import readme_sybil

pytestmark = [
    pytest.mark.timeout(600),
    # With Ray installed the README's Ray block runs too, so CI's `pytest -m ray` step (the only
    # one with Ray) runs the whole README; without it that block is skipped, saying so.
    *([pytest.mark.ray] if importlib.util.find_spec("ray") is not None else []),
    # Ray's own deprecation warnings (as in tests/test_ray.py), not the README's.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


def test_every_readme_block_runs() -> None:
    path = readme_sybil.path / "README.md"
    text = path.read_text(encoding="utf-8")
    # Every python, sh and toml block, and every skip directive, is evaluated or skipped.
    expected = len(re.findall(r"^```(?:python|sh|toml)$", text, re.M))
    expected += len(re.findall(r"^<!-- skip: ", text, re.M))
    document = readme_sybil.parse(path)
    namespace = document.namespace
    ran: list[int] = []
    skipped: list[str] = []
    readme_sybil.setup(namespace)
    try:
        for example in document:
            try:
                example.evaluate()
            except unittest.SkipTest as skip:
                skipped.append(f"line {example.line}: {skip}")
            except SybilFailure as failure:
                pytest.fail(str(failure), pytrace=False)
            else:
                ran.append(example.line)
    finally:
        readme_sybil.teardown(namespace)
    # Printed, not recorded with record_property: that fixture fails under --junitxml's default
    # junit_family (xunit2), and the suite must run with --junitxml.
    print(f"{len(ran)} README blocks ran; skipped: {'; '.join(skipped) or 'none'}")
    assert len(ran) + len(skipped) == expected, (ran, skipped)
    assert len(ran) > len(skipped), f"most README blocks were skipped: {skipped}"
