"""In-memory data of the emulator, scoped per base, and the defaults that complete partial items.

Items travel in their wire form (plain dicts with the spec's camelCase names). ``add_*`` fills
every field not given with a default, merging nested objects, so ``add_job(state="done")`` is
a complete extraction job.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ._embed import decode_data_url
from ._images import ImageFingerprint
from ._search import SearchIndex

__all__ = [
    "APP_URL",
    "CDN_URL",
    "FILES_URL",
    "UUID_RE",
    "BaseData",
    "JobRecord",
    "Store",
    "Workspace",
    "format_timestamp",
    "normalize_page_url",
    "random_uuid",
    "stable_uuid",
]

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
APP_URL = "https://app.example.com"
CDN_URL = "https://cdn.example.com"
FILES_URL = "https://files.example.com"

# Paths whose inner shape the spec leaves open: anything given is kept as is.
_FREE_FORM = frozenset(
    {
        "preferences",
        "data.attributes.document.structured",
        "extraction.document.structured",
        "requestPayload",
        "responseBody",
    }
)
_CHUNK_WORDS = 40


def format_timestamp(moment: datetime | float) -> str:
    """Return an ISO 8601 UTC timestamp with milliseconds and Z, as the spec writes them."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def random_uuid(rng: random.Random | None = None) -> str:
    """Return a version 4 UUID string, drawn from ``rng`` when given (for seeded data)."""
    if rng is None:
        return str(uuid.uuid4())
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def stable_uuid(*parts: str) -> str:
    """Return a version 4 shaped UUID that depends only on ``parts``."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).digest()
    return str(uuid.UUID(bytes=digest, version=4))


def normalize_page_url(url: str) -> str:
    """Return the key a link preview page is stored under (case of scheme/host, no fragment)."""
    parts = urlsplit(url)
    return urlunsplit(
        (parts.scheme.lower(), parts.netloc.lower(), parts.path or "/", parts.query, "")
    )


@dataclass(frozen=True, slots=True)
class Workspace:
    """The workspace every base belongs to, with the owner and root used by defaults."""

    id: str

    @property
    def user(self) -> dict[str, Any]:
        return {"id": stable_uuid(self.id, "user"), "name": "Emulator User", "pictureUrlCdn": None}

    @property
    def root_id(self) -> str:
        return stable_uuid(self.id, "root")

    @property
    def root_folder_id(self) -> str:
        return stable_uuid(self.id, "root-folder")

    def root(self) -> dict[str, Any]:
        return {
            "id": self.root_id,
            "type": "SYSTEM",
            "subtype": "DEFAULT",
            "isPrivate": False,
            "folder": {
                "id": self.root_folder_id,
                "name": "Workspace",
                "isLocked": False,
                "isPasswordProtected": False,
                "user": self.user,
            },
        }


def _image(url: str) -> dict[str, Any]:
    return {"url": url, "width": None, "height": None, "mime": None}


def _file_ref(url: str) -> dict[str, Any]:
    return {"url": url, "size": None, "mime": None}


def default_resource(rid: str, now: str, ws: Workspace, comment_id: str) -> dict[str, Any]:
    """Return a complete resource with every spec field, for ``add_resource`` to merge into."""
    user = ws.user
    return {
        "id": rid,
        "kind": "document",
        "mimeType": None,
        "extension": None,
        "name": None,
        "description": None,
        "size": None,
        "url": f"{APP_URL}/resources/{rid}",
        "commentPinned": {
            "id": comment_id,
            "content": "",
            "createdAt": now,
            "modifiedAt": now,
            "resourceId": rid,
            "anonymousIdentity": {"displayName": None, "sessionHash": None},
            "user": user,
            "mentionedUsers": [],
        },
        "label": {"id": 0, "hexColor": "#00000000"},
        "parent": {"id": ws.root_folder_id, "name": "Workspace"},
        "cover": _image(f"{CDN_URL}/covers/{rid}.webp"),
        "user": user,
        "root": ws.root(),
        "stateProcessing": "done",
        "originUrl": None,
        "tags": [],
        "chats": [],
        "thumbnail": {
            size: f"{CDN_URL}/thumbnails/{rid}/{size}.webp"
            for size in ("sm", "md", "lg", "xl", "original")
        },
        "fileUrl": None,
        "preferences": None,
        "isPasswordProtected": False,
        "isLocked": False,
        "publishedAncestors": [],
        "createdAt": now,
        "modifiedAt": now,
        "data": {
            "infected": False,
            "documentPreview": {"html": None},
            "caption": None,
            "keywords": [],
            "attributes": {
                "document": {
                    "pages": None,
                    "author": None,
                    "title": None,
                    "subject": None,
                    "keywords": None,
                    "producer": None,
                    "creator": None,
                    "security": None,
                    "version": None,
                    "creationDate": None,
                    "modificationDate": None,
                    "documentType": "other",
                    "structured": None,
                },
                "dimensions": {"width": None, "height": None},
                "cover": _image(f"{CDN_URL}/covers/{rid}.webp"),
            },
            "pdfRender": {
                "storagePath": f"renders/{rid}.pdf",
                "url": f"{FILES_URL}/renders/{rid}.pdf",
            },
        },
    }


def default_job(jid: str, now: str, ws: Workspace) -> dict[str, Any]:
    """Return a complete extraction job with every spec field, for ``add_job`` to merge into."""
    base = f"{FILES_URL}/extractions/{jid}"
    return {
        "id": jid,
        "workspaceId": ws.id,
        "userId": ws.user["id"],
        "kind": "document",
        "name": None,
        "url": None,
        "state": "done",
        "createdAt": now,
        "extraction": {
            "common": {
                "mimeType": None,
                "size": None,
                "infected": False,
                "caption": "",
                "keywords": [],
                "thumbnail": f"{base}/thumbnail.webp",
                "chunkCount": 0,
            },
            "media": {
                "width": None,
                "height": None,
                "duration": None,
                "codec": None,
                "bitRate": None,
                "frameRate": None,
                "sampleRate": None,
                "channels": None,
                "color": {
                    "profile": None,
                    "space": None,
                    "alphaChannel": None,
                    "pixelFormat": None,
                },
                "location": {"latitude": None, "longitude": None},
                "device": {"maker": None, "model": None, "software": None},
                "dominantColors": [],
                "ocr": "",
                "screenshot": _image(f"{base}/screenshot.webp"),
                "transcript": _file_ref(f"{base}/transcript.vtt"),
            },
            "document": {
                "pages": 0,
                "author": "",
                "title": "",
                "subject": "",
                "creator": "",
                "producer": "",
                "version": "",
                "security": False,
                "creationDate": now,
                "modificationDate": now,
                "pdfRender": _file_ref(f"{base}/render.pdf"),
                "documentType": "other",
                "structured": {},
            },
            "web": {
                "title": "",
                "siteName": "",
                "description": "",
                "url": "",
                "image": _image(""),
                "favicon": _image(""),
                "html": _file_ref(f"{base}/page.html"),
                "reader": _file_ref(f"{base}/reader.html"),
            },
        },
        "links": {"chunks": f"{base}/chunks.json", "download": f"{base}/download"},
    }


def default_webhook_log(
    lid: str, trace_id: str, attempt: int, now: str, job_id: str
) -> dict[str, Any]:
    """Return a complete webhook log (detail form) for ``add_webhook_log`` to merge into."""
    return {
        "id": lid,
        "traceId": trace_id,
        "attemptNumber": attempt,
        "status": "success",
        "statusCode": 200,
        "errorMessage": None,
        "firedAt": now,
        "createdAt": now,
        "requestPayload": (
            '{"event":"extraction.completed","jobId":"' + job_id + '","state":"done"}'
        ),
        "responseBody": '{"ok":true}',
    }


def merge_fields(
    defaults: dict[str, Any], given: Mapping[str, Any], *, strict: bool, path: str = ""
) -> dict[str, Any]:
    """Return ``defaults`` updated by ``given``, merging nested objects key by key.

    With ``strict``, a key the spec does not define raises ValueError (typo guard); pass
    ``strict=False`` to inject extra fields on purpose, e.g. to test that a client skips them.
    """
    out = dict(defaults)
    for key, value in given.items():
        sub = f"{path}.{key}" if path else key
        if key not in defaults:
            if strict:
                raise ValueError(
                    f"unknown field {sub!r} (wire names are camelCase; pass strict=False "
                    "to add fields the spec does not define)"
                )
            out[key] = copy.deepcopy(value)
            continue
        base = defaults[key]
        if isinstance(base, dict) and isinstance(value, Mapping) and sub not in _FREE_FORM:
            out[key] = merge_fields(base, value, strict=strict, path=sub)
        else:
            out[key] = copy.deepcopy(value)
    return out


def split_text(text: str, words_per_chunk: int = _CHUNK_WORDS) -> list[str]:
    """Split a text into chunks of about ``words_per_chunk`` words."""
    words = text.split()
    return [" ".join(words[i : i + words_per_chunk]) for i in range(0, len(words), words_per_chunk)]


def make_chunks(items: Sequence[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return chunk dicts (text, sequence, pageNumber, timeStart, timeEnd) from texts or dicts."""
    chunks: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        chunk: dict[str, Any] = {
            "text": "",
            "sequence": i,
            "pageNumber": 1,
            "timeStart": 0.0,
            "timeEnd": 0.0,
        }
        if isinstance(item, str):
            chunk["text"] = item
        else:
            unknown = set(item) - set(chunk)
            if unknown:
                raise ValueError(f"unknown chunk field(s) {sorted(unknown)}")
            chunk.update(item)
        chunks.append(chunk)
    return chunks


@dataclass(slots=True)
class JobRecord:
    """A stored extraction job, its scripted state changes and its webhook logs."""

    wire: dict[str, Any]
    next_states: deque[str] = field(default_factory=deque)
    logs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class BaseData:
    """Everything stored for one base (or the workspace itself)."""

    index: SearchIndex = field(default_factory=SearchIndex)
    jobs: dict[str, JobRecord] = field(default_factory=dict)


class Store:
    """Every base's data plus the registered link preview pages (shared by all bases)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.bases: dict[str | None, BaseData] = {}
        self.pages: dict[str, str] = {}
        self.preview_cache: dict[str, dict[str, Any]] = {}

    def base(self, base_id: str | None) -> BaseData:
        """Return a base's data, creating it empty on first use."""
        data = self.bases.get(base_id)
        if data is None:
            data = BaseData()
            self.bases[base_id] = data
        return data

    # -------------------------------------------------------------- resources

    def add_resource(
        self,
        given: Mapping[str, Any],
        *,
        base_id: str | None,
        text: str | None = None,
        chunks: Sequence[str | Mapping[str, Any]] | None = None,
        ancestors: Iterable[str] | None = None,
        image: bytes | str | ImageFingerprint | None = None,
        strict: bool = True,
        ids: Callable[[], str] = random_uuid,
        now: str | None = None,
    ) -> dict[str, Any]:
        """Store a resource completed with defaults and return its wire dict (a copy).

        ``image`` is the resource's picture for image search: its bytes, a base64 data URL,
        or its fingerprint computed beforehand (off the event loop).
        """
        for reserved in ("score", "chunks", "embeddings"):
            if reserved in given:
                raise ValueError(
                    f"{reserved!r} is computed per search hit; give the resource's text with "
                    "text= or chunks= instead"
                )
        picture = decode_data_url(image) if isinstance(image, str) else image
        if picture is not None and not isinstance(picture, bytes | bytearray | ImageFingerprint):
            raise TypeError("image must be bytes or a base64 data URL")
        given = dict(given)
        rid = given.pop("id", None) or ids()
        if not isinstance(rid, str):
            raise ValueError("id must be a string")
        stamp = now or format_timestamp(datetime.now(UTC))
        defaults = default_resource(rid, stamp, self.workspace, ids())
        if isinstance(given.get("tags"), list):
            given["tags"] = [self._tag(t) for t in given["tags"]]
        if isinstance(given.get("chats"), list):
            given["chats"] = [self._chat(c, stamp, ids) for c in given["chats"]]
        wire = merge_fields(defaults, given, strict=strict)
        if chunks is None:
            chunks = split_text(text) if text else []
        elif text is not None:
            raise ValueError("give either text= or chunks=, not both")
        chunk_dicts = make_chunks(chunks)
        if ancestors is None:
            ancestors = self._default_ancestors(wire)
        if isinstance(picture, bytes | bytearray):
            picture = bytes(picture)  # a bytearray the caller could change later
        self.base(base_id).index.add(wire, chunk_dicts, ancestors, picture)
        return copy.deepcopy(wire)

    @staticmethod
    def _default_ancestors(wire: Mapping[str, Any]) -> list[str]:
        found: list[str] = []
        for path in (("parent", "id"), ("root", "folder", "id"), ("root", "id")):
            obj: Any = wire
            for key in path:
                obj = obj.get(key) if isinstance(obj, Mapping) else None
            if isinstance(obj, str) and obj not in found:
                found.append(obj)
        return found

    def _tag(self, tag: Any) -> Any:
        if isinstance(tag, str):
            return {"id": stable_uuid(self.workspace.id, "tag", tag), "name": tag}
        if isinstance(tag, Mapping) and "id" not in tag and isinstance(tag.get("name"), str):
            return {"id": stable_uuid(self.workspace.id, "tag", tag["name"]), **tag}
        return tag

    @staticmethod
    def _chat(chat: Any, now: str, ids: Callable[[], str]) -> Any:
        if not isinstance(chat, Mapping):
            return chat
        defaults = {
            "id": ids(),
            "name": None,
            "isPinned": False,
            "createdAt": now,
            "modifiedAt": now,
            "agent": {"id": ids()},
        }
        return merge_fields(defaults, chat, strict=True, path="chats[]")

    # ------------------------------------------------------------------- jobs

    def add_job(
        self,
        given: Mapping[str, Any],
        *,
        base_id: str | None,
        next_states: Iterable[str] = (),
        strict: bool = True,
        ids: Callable[[], str] = random_uuid,
        now: str | None = None,
    ) -> dict[str, Any]:
        """Store an extraction job completed with defaults and return it (a copy)."""
        given = dict(given)
        jid = given.pop("id", None) or ids()
        if not isinstance(jid, str):
            raise ValueError("id must be a string")
        base = self.base(base_id)
        if jid in base.jobs:
            raise ValueError(f"an extraction job with id {jid!r} already exists in this base")
        stamp = now or format_timestamp(datetime.now(UTC))
        wire = merge_fields(default_job(jid, stamp, self.workspace), given, strict=strict)
        base.jobs[jid] = JobRecord(wire=wire, next_states=deque(next_states))
        return copy.deepcopy(wire)

    def job(self, job_id: str, base_id: str | None) -> JobRecord:
        """Return a stored job; raise KeyError when the base has no such job."""
        record = self.base(base_id).jobs.get(job_id)
        if record is None:
            raise KeyError(f"no extraction job {job_id!r} in base {base_id!r}")
        return record

    def add_webhook_log(
        self,
        job_id: str,
        given: Mapping[str, Any],
        *,
        base_id: str | None,
        strict: bool = True,
        ids: Callable[[], str] = random_uuid,
        now: str | None = None,
    ) -> dict[str, Any]:
        """Store a webhook log (detail form) for a job and return it (a copy)."""
        record = self.job(job_id, base_id)
        given = dict(given)
        lid = given.pop("id", None) or ids()
        if lid in record.logs:
            raise ValueError(f"a webhook log with id {lid!r} already exists for this job")
        stamp = now or format_timestamp(datetime.now(UTC))
        trace = ids()
        defaults = default_webhook_log(lid, trace, len(record.logs) + 1, stamp, job_id)
        wire = merge_fields(defaults, given, strict=strict)
        record.logs[lid] = wire
        return copy.deepcopy(wire)

    # ------------------------------------------------------------------ pages

    def add_page(self, url: str, html: str) -> None:
        """Register (or replace) the HTML the link preview endpoint reads for ``url``."""
        if not isinstance(url, str) or not isinstance(html, str):
            raise TypeError("add_page takes the page URL and its HTML as strings")
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ValueError(
                f"a page URL must be an absolute http(s) URL ({exc}): {url!r}"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("a page URL must be an absolute http(s) URL")
        self.pages[normalize_page_url(url)] = html
