"""Link previews with no network: Open Graph parsing of registered pages, else a synthetic one."""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

__all__ = ["SYNTHETIC_IMAGE_BASE", "parse_preview", "synthetic_preview"]

#: Where the synthetic previews' images point (a made-up CDN; nothing is served there).
SYNTHETIC_IMAGE_BASE = "https://cdn.example.com/link-previews/"
_WORD_RE = re.compile(r"[^\W_]+")


class _HeadParser(HTMLParser):
    """Collects meta tags, icon links and the title of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.meta: dict[str, str] = {}
        self.icons: list[dict[str, str]] = []
        self.title: str | None = None
        self._in_title = False
        self._title_parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k.lower(): v for k, v in attrs if v is not None}
        if tag == "meta":
            key = (
                values.get("property")
                or values.get("name")
                or values.get("itemprop")
                or values.get("http-equiv")
            )
            content = values.get("content")
            # The first occurrence wins: og:image may repeat, and the first is the main one.
            if key and content is not None and key not in self.meta:
                self.meta[key] = content.strip()
        elif tag == "link":
            rel = values.get("rel", "").lower().split()
            if "icon" in rel and values.get("href"):
                self.icons.append(values)
        elif tag == "title" and self.title is None:
            self._in_title = True

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag == "title":
            self._in_title = False

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._in_title:
            self._in_title = False
            self.title = " ".join("".join(self._title_parts).split()) or None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._title_parts.append(data)


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def _sizes(value: str | None) -> tuple[int | None, int | None]:
    if not value:
        return None, None
    first = value.lower().split()[0]
    width, _, height = first.partition("x")
    return _int_or_none(width), _int_or_none(height)


def parse_preview(url: str, html: str) -> dict[str, Any]:
    """Return the link preview (spec 2.4) of ``html`` served at ``url``.

    title falls back to ``<title>``, description to ``<meta name="description">``, type to
    "link"; a missing og:image gives an image descriptor with an empty url; a missing icon link
    gives ``/favicon.ico`` of the page's origin. Relative URLs are resolved against ``url``.
    metadata holds every meta tag (property, name, itemprop or http-equiv -> content).
    """
    parser = _HeadParser()
    parser.feed(html)
    parser.close()
    meta = parser.meta

    image_url = meta.get("og:image") or meta.get("og:image:url") or meta.get("og:image:secure_url")
    image = {
        "url": urljoin(url, image_url) if image_url else "",
        "width": _int_or_none(meta.get("og:image:width")),
        "height": _int_or_none(meta.get("og:image:height")),
        "mime": meta.get("og:image:type") or None,
    }
    if parser.icons:
        icon = parser.icons[0]
        width, height = _sizes(icon.get("sizes"))
        favicon = {
            "url": urljoin(url, icon["href"]),
            "width": width,
            "height": height,
            "mime": icon.get("type") or None,
        }
    else:
        parts = urlsplit(url)
        favicon = {
            "url": f"{parts.scheme}://{parts.netloc}/favicon.ico",
            "width": None,
            "height": None,
            "mime": None,
        }
    return {
        "url": url,
        "title": meta.get("og:title") or parser.title,
        "type": meta.get("og:type") or "link",
        "description": meta.get("og:description") or meta.get("description") or None,
        "siteName": meta.get("og:site_name") or None,
        "image": image,
        "favicon": favicon,
        "metadata": dict(meta),
    }


def synthetic_preview(url: str) -> dict[str, Any]:
    """Return a deterministic preview (spec 2.4) of a URL that no registered page describes.

    Everything is derived from the URL: the title from the last path segment's words (else the
    host, else the URL), the site name from the host without ``www.``, the image a 1200 x 630
    PNG named after a hash of the URL, the favicon ``/favicon.ico`` of an http(s) origin (an
    empty url otherwise). ``metadata`` holds the Open Graph tags such a page would carry.
    """
    parts = urlsplit(url)
    web = parts.scheme.lower() in ("http", "https") and bool(parts.netloc)
    host = (parts.hostname or "").removeprefix("www.")
    segments = [s for s in unquote(parts.path).split("/") if s] if web else []
    last = segments[-1].rsplit(".", 1)[0] if segments else ""
    words = _WORD_RE.findall(last)
    title = " ".join(words).capitalize() if words else (host or url)
    description = f"{title}, on {host}." if host else f"{title}."
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    image = {
        "url": f"{SYNTHETIC_IMAGE_BASE}{digest}.png",
        "width": 1200,
        "height": 630,
        "mime": "image/png",
    }
    favicon = {
        "url": f"{parts.scheme.lower()}://{parts.netloc}/favicon.ico" if web else "",
        "width": None,
        "height": None,
        "mime": None,
    }
    metadata = {
        "og:title": title,
        "og:description": description,
        "og:image": image["url"],
        "og:url": url,
    }
    if host:
        metadata["og:site_name"] = host
    return {
        "url": url,
        "title": title,
        "type": "link",
        "description": description,
        "siteName": host or None,
        "image": image,
        "favicon": favicon,
        "metadata": metadata,
    }
