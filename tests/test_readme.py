"""Every code block of README.md and of docs/**/*.md runs, in order, against the bundled
emulator (tests/readme.py).

Each page is one test, so that random test order (pytest-randomly) and workers (pytest-xdist)
never split blocks that build on each other; a failure names the page and the block's line.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import unittest
from pathlib import Path
from typing import Any

import pytest
from sybil.example import SybilFailure

from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator
from tests.readme import readme_sybil

ROOT = readme_sybil.path
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
#: The pages with a block that needs Ray: CI's `pytest -m ray` step (the only one with Ray
#: installed) runs them; elsewhere that block is skipped, saying so.
RAY_PAGES = {"docs/guides/ray.md"}
_ray_installed = importlib.util.find_spec("ray") is not None

pytestmark = [
    pytest.mark.timeout(600),
    # Ray's own deprecation warnings (as in tests/test_ray.py), not the docs'.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


def _page_params() -> list[object]:
    return [
        pytest.param(page, marks=[pytest.mark.ray] if page in RAY_PAGES and _ray_installed else [])
        for page in PAGES
    ]


@pytest.mark.parametrize("page", _page_params())
def test_every_block_of_the_page_runs(page: str) -> None:
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    # Every python, sh and toml block, and every skip directive, is evaluated or skipped.
    expected = len(re.findall(r"^```(?:python|sh|toml)$", text, re.M))
    expected += len(re.findall(r"^<!-- skip: ", text, re.M))
    if expected == 0:
        return  # a page of prose or of API reference only
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
                pytest.fail(f"{page}: {failure}", pytrace=False)
            else:
                ran.append(example.line)
    finally:
        readme_sybil.teardown(namespace)
    # Printed, not recorded with record_property: that fixture fails under --junitxml's default
    # junit_family (xunit2), and the suite must run with --junitxml.
    print(f"{page}: {len(ran)} blocks ran; skipped: {'; '.join(skipped) or 'none'}")
    assert len(ran) + len(skipped) == expected, (ran, skipped)
    if page == "README.md":
        assert len(ran) > len(skipped), f"most README blocks were skipped: {skipped}"


def test_every_page_is_in_the_site_navigation() -> None:
    """A page left out of mkdocs.yml's nav is built but hard to find; a nav entry without its
    page fails `mkdocs build --strict`."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert Path(page).relative_to("docs").as_posix() in nav, page


def test_the_tour_finds_hits_next_to_a_default_serve() -> None:
    """The README's first tour block, on what ``asyncsearch serve`` starts with no options
    (seed 0, 200 resources): its filters once excluded every seeded document."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text.split("\n## A short tour\n", 1)[1]
    match = re.search(r"^```python\n(.*?)^```$", tour, re.S | re.M)
    assert match is not None
    code = compile(match.group(1), "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

    async def run() -> dict[str, Any]:
        async with (
            ServiceEmulator(seed=0) as emulator,  # serve's defaults
            AsyncSearchClient(api_key=emulator.api_key, base_url=emulator.base_url) as client,
        ):
            namespace: dict[str, Any] = {"client": client}
            await eval(code, namespace)
            return namespace

    namespace = asyncio.run(run())
    assert namespace["page"].hits, "the README's first search finds nothing on a default serve"
    assert namespace["matrix"].shape == (len(namespace["page"].hits), 512)
