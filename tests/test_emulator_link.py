"""GET /v2/link on the emulator, and its Open Graph parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch import AsyncSearchClient, InternalServerError
from asyncsearch.testing import ServiceEmulator
from asyncsearch.testing._linkpreview import SYNTHETIC_IMAGE_BASE, parse_preview

from .conftest import EMULATOR_KEY as KEY

ARTICLE = "https://www.example.org/articles/harbor-sunset"
TIMEOUT = aiohttp.ClientTimeout(total=20)


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


async def test_an_unregistered_url_gets_a_synthetic_preview_derived_from_it(
    http: aiohttp.ClientSession,
) -> None:
    url = "https://www.nowhere.example.org/guides/red-bicycles.html?ref=1"
    first = await preview(http, url=url)
    assert first == await preview(http, url=url, type="link")  # deterministic
    assert first["url"] == url
    assert first["title"] == "Red bicycles"
    assert first["siteName"] == "nowhere.example.org"
    assert "nowhere.example.org" in first["description"]
    assert first["type"] == "link"
    assert first["image"]["url"].startswith(SYNTHETIC_IMAGE_BASE)
    assert (first["image"]["width"], first["image"]["height"]) == (1200, 630)
    assert first["favicon"]["url"] == "https://www.nowhere.example.org/favicon.ico"
    assert first["metadata"]["og:title"] == "Red bicycles"
    other = await preview(http, url="https://www.nowhere.example.org/guides/blue-boats")
    assert other["title"] == "Blue boats"
    assert other["image"]["url"] != first["image"]["url"]


async def test_a_page_registered_after_a_synthetic_preview_takes_its_place(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    url = "https://later.example.org/post"
    assert (await preview(http, url=url))["title"] == "Post"
    emu.add_page(url, "<title>The real post</title>")
    assert (await preview(http, url=url))["title"] == "The real post"


async def test_link_preview_of_the_client_works_on_any_url(emu: ServiceEmulator) -> None:
    async with AsyncSearchClient(api_key=emu.api_key, base_url=emu.base_url) as client:
        found = await client.link_preview("https://unregistered.example.net/hello-world")
        assert found.title == "Hello world"
        assert found.site_name == "unregistered.example.net"
        emu.faults.script("link", [503])
        with pytest.raises(InternalServerError) as caught:
            await client.with_options(max_retries=0).link_preview(
                "https://unregistered.example.net/hello-world"
            )
        assert caught.value.status_code == 503


@pytest.mark.parametrize(
    "url",
    [
        # Every character class RFC 3986 allows unencoded, and a percent-encoded space.
        "https://user:pw@www.example.org:8443/a%20page/(1);v=2!*'$,~_.-?q=a+b&c=d/e?f@g:h#top/x?y",
        "http://[::1]:8080/x",
        "http://[v1.fe]/x",
        "HTTPS://WWW.EXAMPLE.ORG",
    ],
)
async def test_every_url_the_strict_mode_previews_the_lenient_one_does(url: str) -> None:
    for strict in (False, True):
        async with (
            ServiceEmulator(api_key=KEY, strict=strict) as emulator,
            aiohttp.ClientSession(
                emulator.base_url, headers={"X-Api-Key": KEY}, timeout=TIMEOUT
            ) as session,
        ):
            assert (await preview(session, url=url))["url"] == url
            body = await preview(session, status=422, url="no-scheme/here")
            assert body["error"]["field"] == "url"


@pytest.mark.parametrize(
    ("url", "lenient_status"),
    [
        pytest.param("https://www.example.org/a page with spaces", 200, id="space-in-path"),
        pytest.param("https://www.example.org/?q=a b", 200, id="space-in-query"),
        pytest.param("https://exa mple.org/", 200, id="space-in-host"),
        pytest.param("https://www.example.org/a\nb", 200, id="newline"),
        pytest.param("https://www.example.org/a\n", 200, id="trailing-newline"),
        pytest.param("https://www.example.org/a\rb", 200, id="carriage-return"),
        pytest.param("https://www.example.org/a\tb", 200, id="tab"),
        pytest.param("https://www.example.org/a\x00b", 200, id="nul"),
        pytest.param("https://www.example.org/a\x1bb", 200, id="escape"),
        pytest.param("https://www.example.org/a\x7fb", 200, id="delete"),
        pytest.param("https://www.example.org/caf\u00e9", 200, id="non-ascii"),
        pytest.param("https://www.example.org/\u2028", 200, id="line-separator"),
        pytest.param('https://www.example.org/a"b<c>', 200, id="quote-and-angle-brackets"),
        pytest.param(
            "https://www.example.org/a{b}|c\\d^e`f", 200, id="braces-bar-backslash-caret-backtick"
        ),
        pytest.param("https://www.example.org/a[1]", 200, id="square-brackets-in-path"),
        pytest.param("https://www.example.org/a%zz", 200, id="percent-not-hex"),
        pytest.param("https://www.example.org/a%2", 200, id="percent-cut-short"),
        pytest.param("https://www.example.org/a#b#c", 200, id="second-hash"),
        # Refused by the lenient mode already (no scheme first); the strict one took them.
        pytest.param(" https://www.example.org/", 422, id="leading-space"),
        pytest.param("\nhttps://www.example.org/", 422, id="leading-newline"),
    ],
)
async def test_a_url_that_is_no_rfc_3986_uri_is_refused_when_strict(
    url: str, lenient_status: int
) -> None:
    for strict in (False, True):
        async with (
            ServiceEmulator(api_key=KEY, strict=strict) as emulator,
            aiohttp.ClientSession(
                emulator.base_url, headers={"X-Api-Key": KEY}, timeout=TIMEOUT
            ) as session,
        ):
            body = await preview(session, status=422 if strict else lenient_status, url=url)
        if strict or lenient_status == 422:
            assert (body["error"]["code"], body["error"]["field"]) == ("validation_error", "url")
        else:
            assert body["url"] == url  # the lenient mode previews it as before


@pytest.mark.parametrize(
    "url", ["ftp://files.example.org/x.tar", "mailto:someone@example.org", "urn:isbn:0451450523"]
)
async def test_any_uri_is_previewed_by_default_and_refused_when_strict(url: str) -> None:
    for strict in (False, True):
        async with (
            ServiceEmulator(api_key=KEY, strict=strict) as emulator,
            aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as session,
        ):
            body = await preview(session, status=422 if strict else 200, url=url)
        if strict:
            assert body["error"]["field"] == "url"
        else:
            assert body["url"] == url
            assert body["title"]
            assert body["favicon"]["url"] == ""  # no http(s) origin to take it from


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "url"),
        ({"url": "/relative/path"}, "url"),
        ({"url": ARTICLE, "type": "fresh"}, "type"),
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


@pytest.mark.parametrize("url", ["http://[::1", "http://a]b/x"])
async def test_a_url_that_does_not_parse_gets_a_422_in_both_modes(url: str) -> None:
    for strict in (False, True):
        async with (
            ServiceEmulator(api_key=KEY, strict=strict) as emulator,
            aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as session,
        ):
            body = await preview(session, status=422, url=url)
        assert body["error"]["code"] == "validation_error"
        assert body["error"]["field"] == "url"


@pytest.mark.parametrize("url", ["http://[::1", "http://a]b/x"])
def test_add_page_refuses_a_url_that_does_not_parse(url: str) -> None:
    emulator = ServiceEmulator()
    with pytest.raises(ValueError, match="absolute http"):
        emulator.add_page(url, "<title>x</title>")
    assert not emulator.store.pages


def test_add_page_refuses_a_url_or_html_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="strings"):
        ServiceEmulator().add_page(b"https://example.org/", "<title>x</title>")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="strings"):
        ServiceEmulator().add_page("https://example.org/", None)  # type: ignore[arg-type]
