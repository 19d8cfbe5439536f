"""GET /v2/link on the emulator, and its Open Graph parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator
from asyncsearch.testing._linkpreview import parse_preview

from .conftest import EMULATOR_KEY as KEY

ARTICLE = "https://www.example.org/articles/harbor-sunset"


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=0, n_jobs=0) as emulator:
        yield emulator


async def preview(http: aiohttp.ClientSession, status: int = 200, **params: str) -> Any:
    async with http.get("/v2/link", params=params) as response:
        assert response.status == status, await response.text()
        return await response.json()


def test_open_graph_tags_fill_the_preview() -> None:
    html = """<html><head><title>Fallback</title>
    <meta property="og:title" content="Harbor at dusk">
    <meta property="og:type" content="article">
    <meta property="og:description" content="Boats &amp; light.">
    <meta property="og:site_name" content="Example News">
    <meta property="og:image" content="/img/harbor.jpg">
    <meta property="og:image" content="/img/second.jpg">
    <meta property="og:image:width" content="1200">
    <meta property="og:image:height" content="not a number">
    <meta property="og:image:type" content="image/jpeg">
    <meta name="author" content="Grace">
    <META NAME="Keywords" CONTENT="boats, harbor">
    <link rel="icon" href="icons/fav.png" type="image/png" sizes="48x48">
    </head></html>"""
    result = parse_preview("https://news.example.org/story/1", html)
    assert result == {
        "url": "https://news.example.org/story/1",
        "title": "Harbor at dusk",
        "type": "article",
        "description": "Boats & light.",
        "siteName": "Example News",
        "image": {
            "url": "https://news.example.org/img/harbor.jpg",
            "width": 1200,
            "height": None,
            "mime": "image/jpeg",
        },
        "favicon": {
            "url": "https://news.example.org/story/icons/fav.png",
            "width": 48,
            "height": 48,
            "mime": "image/png",
        },
        "metadata": {
            "og:title": "Harbor at dusk",
            "og:type": "article",
            "og:description": "Boats & light.",
            "og:site_name": "Example News",
            "og:image": "/img/harbor.jpg",
            "og:image:width": "1200",
            "og:image:height": "not a number",
            "og:image:type": "image/jpeg",
            "author": "Grace",
            "Keywords": "boats, harbor",
        },
    }


def test_a_page_without_open_graph_falls_back_to_plain_html() -> None:
    html = """<title>
      Plain   page </title><meta name="description" content="Just HTML.">"""
    result = parse_preview("https://plain.example.org/a?b=c", html)
    assert result["title"] == "Plain page"
    assert result["type"] == "link"
    assert result["description"] == "Just HTML."
    assert result["siteName"] is None
    assert result["image"] == {"url": "", "width": None, "height": None, "mime": None}
    assert result["favicon"] == {
        "url": "https://plain.example.org/favicon.ico",
        "width": None,
        "height": None,
        "mime": None,
    }
    assert result["metadata"] == {"description": "Just HTML."}


def test_an_empty_page_gives_nulls() -> None:
    result = parse_preview("https://empty.example.org/", "")
    assert result["title"] is None
    assert result["description"] is None
    assert result["metadata"] == {}


async def test_seeded_pages_are_previewed(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    assert ARTICLE in emu.page_urls
    result = await preview(http, url=ARTICLE)
    assert result["title"] == "Sunset at the harbor"
    assert result["type"] == "article"
    assert result["siteName"] == "Example News"
    assert result["image"]["width"] == 1200
    assert result["favicon"]["url"] == "https://www.example.org/static/favicon-32.png"
    assert result["metadata"]["twitter:card"] == "summary_large_image"
    for url in emu.page_urls:
        result = await preview(http, url=url)
        assert set(result) == {
            "url",
            "title",
            "type",
            "description",
            "siteName",
            "image",
            "favicon",
            "metadata",
        }
        assert result["url"] == url


async def test_cache_serves_the_first_parse_and_link_reparses(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    url = "https://changing.example.org/page"
    emu.add_page(url, '<meta property="og:title" content="First">')
    assert (await preview(http, url=url))["title"] == "First"
    emu.add_page(url, '<meta property="og:title" content="Second">')
    assert (await preview(http, url=url))["title"] == "First", "type defaults to cache"
    assert (await preview(http, url=url, type="cache"))["title"] == "First"
    assert (await preview(http, url=url, type="link"))["title"] == "Second"
    assert (await preview(http, url=url))["title"] == "Second", "link refreshed the cache"


async def test_urls_match_without_fragment_and_with_any_host_case(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.add_page("https://Case.Example.org", "<title>Root</title>")
    assert (await preview(http, url="https://case.example.org/#top"))["title"] == "Root"


async def test_an_unregistered_url_is_a_404(http: aiohttp.ClientSession) -> None:
    body = await preview(http, status=404, url="https://nowhere.example.org/")
    assert body["error"]["code"] == "not_found"
    assert body["error"]["field"] == "url"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "url"),
        ({"url": "/relative/path"}, "url"),
        ({"url": "ftp://files.example.org/x"}, "url"),
        ({"url": ARTICLE, "type": "fresh"}, "type"),
        ({"url": ARTICLE, "kind": "link"}, "kind"),
    ],
)
async def test_bad_parameters_get_a_422(
    http: aiohttp.ClientSession, params: dict[str, str], field: str
) -> None:
    body = await preview(http, status=422, **params)
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["field"] == field


def test_add_page_refuses_relative_urls() -> None:
    with pytest.raises(ValueError, match="absolute"):
        ServiceEmulator().add_page("/x", "<title>x</title>")
