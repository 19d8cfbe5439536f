"""Deterministic, realistic response bodies: search pages with every field filled, and jobs.

The shapes follow ``tests/samples/search_page.json`` and ``tests/samples/extraction_job.json``:
every field of a hit is present (as the service sends it), with 512 ``small3_512`` and 768
``clip2`` embedding values per hit, written the way a JSON encoder writes float64 values rounded
to 12 decimals (about 16 bytes each), so a 1000-hit page is about 24 MB, as in the README.

Only the standard library is used here: the benchmark server imports it too.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from typing import Any

__all__ = ["hit_ids", "job_body", "job_template", "search_hit", "search_page_body"]

_WORDS = " ".join(
    (
        "invoice revenue harbor guitar budget contract quarterly report travel engineering",
        "marketing legal health cooking nature music sports summary meeting review draft final",
        "design launch roadmap pipeline customer supplier margin forecast audit policy",
    )
).split()
_KINDS = ("document", "image", "video", "audio", "bookmark", "note", "default")
_MIMES = ("application/pdf", "image/png", "video/mp4", "audio/mpeg", "text/html", "text/plain")


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _stamp(rng: random.Random) -> str:
    return (
        f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
        f"{rng.randint(0, 999):03d}Z"
    )


def _user(rng: random.Random) -> dict[str, Any]:
    uid = _uuid(rng)
    return {
        "id": uid,
        "name": _words(rng, 2).title(),
        "pictureUrlCdn": f"https://cdn.example.com/users/{uid}.png",
    }


def _image(rng: random.Random, name: str) -> dict[str, Any]:
    return {
        "url": f"https://cdn.example.com/{name}/{rng.getrandbits(40):x}.png",
        "width": rng.choice((320, 640, 1280)),
        "height": rng.choice((240, 480, 960)),
        "mime": "image/png",
    }


_POOL_SIZE = 61
_vector_pools: dict[int, list[list[float]]] = {}


def _vector(rng: random.Random, dims: int) -> list[float]:
    """A unit vector of ``dims`` values, drawn from a fixed pool (making one is slow in Python)."""
    pool = _vector_pools.get(dims)
    if pool is None:
        pool_rng = random.Random(dims)
        pool = []
        for _ in range(_POOL_SIZE):
            values = [pool_rng.gauss(0.0, 1.0) for _ in range(dims)]
            norm = math.sqrt(sum(v * v for v in values))
            pool.append([round(v / norm, 12) for v in values])
        _vector_pools[dims] = pool
    return pool[rng.randrange(_POOL_SIZE)]


def search_hit(index: int, *, seed: int = 0, embeddings: bool = True) -> dict[str, Any]:
    """One search hit in wire form, every field filled; the same arguments give the same hit."""
    rng = random.Random(seed * 1_000_003 + index)
    rid = _uuid(rng)
    user = _user(rng)
    kind = rng.choice(_KINDS)
    name = _words(rng, 3).capitalize()
    hit: dict[str, Any] = {
        "id": rid,
        "kind": kind,
        "mimeType": rng.choice(_MIMES),
        "extension": rng.choice(("pdf", "png", "mp4", "mp3", "html", "txt")),
        "name": name,
        "description": _words(rng, 12).capitalize() + ".",
        "size": rng.randint(1_000, 50_000_000),
        "url": f"https://app.example.com/r/{rid}",
        "commentPinned": {
            "id": _uuid(rng),
            "content": _words(rng, 8).capitalize() + ".",
            "createdAt": _stamp(rng),
            "modifiedAt": _stamp(rng),
            "resourceId": rid,
            "anonymousIdentity": {
                "displayName": "Guest",
                "sessionHash": f"{rng.getrandbits(64):x}",
            },
            "user": user,
            "mentionedUsers": [_user(rng) for _ in range(2)],
        },
        "label": {"id": rng.randint(0, 8), "hexColor": f"#{rng.getrandbits(24):06x}"},
        "parent": {"id": _uuid(rng), "name": _words(rng, 1).capitalize()},
        "cover": _image(rng, "covers"),
        "user": user,
        "root": {
            "id": _uuid(rng),
            "type": rng.choice(("SYSTEM", "USER", "SHARED")),
            "subtype": rng.choice(("DEFAULT", "PRIVATE", "TEAM")),
            "isPrivate": rng.random() < 0.5,
            "folder": {
                "id": _uuid(rng),
                "name": _words(rng, 1).capitalize(),
                "isLocked": rng.random() < 0.2,
                "isPasswordProtected": rng.random() < 0.1,
                "user": user,
            },
        },
        "stateProcessing": rng.choice(("pending", "processing", "done", "failed")),
        "originUrl": f"https://example.com/{rng.getrandbits(32):x}/{name.replace(' ', '-')}",
        "tags": [{"id": _uuid(rng), "name": rng.choice(_WORDS)} for _ in range(3)],
        "chats": [
            {
                "id": _uuid(rng),
                "name": _words(rng, 3).capitalize(),
                "isPinned": rng.random() < 0.3,
                "createdAt": _stamp(rng),
                "modifiedAt": _stamp(rng),
                "agent": {"id": _uuid(rng)},
            }
        ],
        "thumbnail": {
            size: f"https://cdn.example.com/thumbs/{rid}/{size}.webp"
            for size in ("sm", "md", "lg", "xl", "original")
        },
        "fileUrl": f"https://files.example.com/{rid}.{kind}",
        "preferences": json.dumps({"view": rng.choice(("grid", "list"))}),
        "isPasswordProtected": rng.random() < 0.1,
        "isLocked": rng.random() < 0.2,
        "publishedAncestors": [
            {"resourceId": _uuid(rng), "accessToken": f"{rng.getrandbits(96):x}"}
        ],
        "createdAt": _stamp(rng),
        "modifiedAt": _stamp(rng),
        "data": {
            "infected": False,
            "documentPreview": {"html": f"<p>{_words(rng, 10)}</p>"},
            "caption": _words(rng, 10).capitalize() + ".",
            "keywords": [rng.choice(_WORDS) for _ in range(4)],
            "attributes": {
                "document": {
                    "pages": rng.randint(1, 300),
                    "author": _words(rng, 2).title(),
                    "title": name,
                    "subject": _words(rng, 2),
                    "keywords": ", ".join(rng.choice(_WORDS) for _ in range(3)),
                    "producer": "LibreOffice",
                    "creator": "Writer",
                    "security": False,
                    "version": "1.7",
                    "creationDate": "D:20240501090000Z",
                    "modificationDate": "D:20240503090000Z",
                    "documentType": rng.choice(("invoice", "receipt", "contract", "report")),
                    "structured": {"total": round(rng.uniform(10, 5000), 2), "currency": "EUR"},
                },
                "dimensions": {"width": 595, "height": 842},
                "cover": _image(rng, "covers"),
            },
            "pdfRender": {
                "storagePath": f"renders/{rid}.pdf",
                "url": f"https://cdn.example.com/renders/{rid}.pdf",
            },
        },
        "score": round(rng.random(), 6),
        "chunks": [
            {
                "text": _words(rng, 30).capitalize() + ".",
                "sequence": rng.randint(0, 200),
                "pageNumber": rng.randint(1, 40),
                "timeStart": round(rng.uniform(0, 100), 3),
                "timeEnd": round(rng.uniform(100, 200), 3),
                "score": round(rng.random(), 6),
            }
            for _ in range(2)
        ],
    }
    if embeddings:
        hit["embeddings"] = {"small3_512": _vector(rng, 512), "clip2": _vector(rng, 768)}
    else:
        hit["embeddings"] = None
    return hit


def search_page_body(
    n_hits: int,
    *,
    seed: int = 0,
    first_index: int = 0,
    embeddings: bool = True,
    total: int | None = None,
    has_more: bool = False,
) -> bytes:
    """A ``POST /v2/search`` answer holding hits ``first_index`` .. ``first_index + n_hits - 1``."""
    hits = [search_hit(first_index + i, seed=seed, embeddings=embeddings) for i in range(n_hits)]
    page = {"total": n_hits if total is None else total, "hasMore": has_more, "hits": hits}
    return json.dumps(page, separators=(",", ":")).encode()


def hit_ids(body: bytes) -> list[str]:
    """The hit ids of a search page body (to check that pages differ)."""
    return [hit["id"] for hit in json.loads(body)["hits"]]


_JOB_ID_PLACEHOLDER = "00000000-0000-4000-8000-000000000000"


def job_template(*, seed: int = 0) -> tuple[bytes, bytes]:
    """A ~3 KB ``GET /v2/extract/{jobId}`` answer, split around its ``id`` value.

    ``prefix + job_id + suffix`` is the body for ``job_id``; the server fills in the requested id
    without encoding anything per request.
    """
    rng = random.Random(seed)
    job = {
        "id": _JOB_ID_PLACEHOLDER,
        "workspaceId": _uuid(rng),
        "userId": _uuid(rng),
        "kind": "document",
        "name": "quarterly-report-q3-2024.pdf",
        "url": "https://example.com/files/quarterly-report-q3-2024.pdf",
        "state": "done",
        "createdAt": "2024-05-01T09:00:00.123Z",
        "extraction": {
            "common": {
                "mimeType": "application/pdf",
                "size": 482113,
                "infected": False,
                "caption": _words(rng, 60).capitalize() + ".",
                "keywords": [rng.choice(_WORDS) for _ in range(8)],
                "thumbnail": "https://cdn.example.com/thumbs/q3.png",
                "chunkCount": 12,
            },
            "media": {
                "width": 1920,
                "height": 1080,
                "duration": 12.5,
                "codec": "h264",
                "bitRate": 800000,
                "frameRate": 29.97,
                "sampleRate": 44100,
                "channels": 2,
                "color": {
                    "profile": "sRGB",
                    "space": "RGB",
                    "alphaChannel": False,
                    "pixelFormat": "yuv420p",
                },
                "location": {"latitude": 52.52, "longitude": 13.405},
                "device": {"maker": "Canon", "model": "EOS R5", "software": "1.0"},
                "dominantColors": [
                    {"rgb": [rng.randint(0, 255) for _ in range(3)], "score": 0.4},
                    {"rgb": [rng.randint(0, 255) for _ in range(3)], "score": 0.25},
                ],
                "ocr": _words(rng, 50).upper(),
                "screenshot": _image(rng, "screenshots"),
                "transcript": {
                    "url": "https://cdn.example.com/transcripts/q3.vtt",
                    "size": 2048,
                    "mime": "text/vtt",
                },
            },
            "document": {
                "pages": 12,
                "author": "Finance team",
                "title": "Q3 report",
                "subject": "Revenue and costs",
                "creator": "Writer",
                "producer": "LibreOffice 7.6",
                "version": "1.7",
                "security": False,
                "creationDate": "2024-05-01T09:00:00.000Z",
                "modificationDate": "2024-05-03T09:00:00.000Z",
                "pdfRender": {
                    "url": "https://cdn.example.com/renders/q3.pdf",
                    "size": 1024,
                    "mime": "application/pdf",
                },
                "documentType": "report",
                "structured": {"lines": [1, 2, 3], "total": 1200.5, "currency": "EUR"},
            },
            "web": {
                "title": "Q3 report",
                "siteName": "Example",
                "description": _words(rng, 20).capitalize() + ".",
                "url": "https://example.com/reports/q3",
                "image": _image(rng, "og"),
                "favicon": _image(rng, "favicons"),
                "html": {
                    "url": "https://cdn.example.com/q3.html",
                    "size": 1024,
                    "mime": "text/html",
                },
                "reader": {
                    "url": "https://cdn.example.com/q3-reader.html",
                    "size": 1024,
                    "mime": "text/html",
                },
            },
        },
        "links": {
            "chunks": "https://api.example.com/v2/extract/chunks",
            "download": "https://api.example.com/v2/extract/download",
        },
    }
    text = json.dumps(job, separators=(",", ":"))
    prefix, suffix = text.split(_JOB_ID_PLACEHOLDER)
    return prefix.encode(), suffix.encode()


def job_body(job_id: str, *, seed: int = 0) -> bytes:
    """The whole job body for ``job_id``."""
    prefix, suffix = job_template(seed=seed)
    return prefix + job_id.encode() + suffix
