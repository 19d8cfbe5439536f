"""Deterministic, realistic seed data: resources with text, jobs with webhook logs, pages.

The same seed gives byte-identical data in every process (only ``random.Random(seed)`` and
hashes of fixed strings are used, never ``hash()`` of a str or the clock). Every field of the
spec is filled; nullable fields carry a realistic mix of values and nulls.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from ._store import (
    CDN_URL,
    FILES_URL,
    BaseData,
    JobRecord,
    Store,
    format_timestamp,
    random_uuid,
)

__all__ = ["TOPICS", "seed_base", "seed_pages"]

_EPOCH = datetime(2023, 1, 2, 8, 0, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Topic:
    """Word lists one subject's texts are built from."""

    name: str
    nouns: tuple[str, ...]
    adjectives: tuple[str, ...]
    verbs: tuple[str, ...]


def _topic(name: str, nouns: str, adjectives: str, verbs: str) -> Topic:
    return Topic(name, tuple(nouns.split()), tuple(adjectives.split()), tuple(verbs.split()))


TOPICS: tuple[Topic, ...] = (
    _topic(
        "finance",
        "invoice payment budget expense revenue forecast ledger receipt tax audit balance "
        "account vendor payroll refund transaction statement margin dividend pension",
        "quarterly annual overdue net gross fiscal monthly outstanding approved itemized",
        "reviewed approved reconciled submitted paid audited adjusted invoiced",
    ),
    _topic(
        "travel",
        "itinerary flight hotel passport beach harbor museum train luggage sunset island "
        "reservation map city village lake coast trail ferry cathedral",
        "coastal scenic overnight sunny crowded quiet historic tropical alpine rainy",
        "booked visited explored photographed cancelled hiked boarded planned",
    ),
    _topic(
        "engineering",
        "server database deployment latency cache cluster pipeline release kernel network "
        "protocol sensor circuit prototype bridge turbine engine firmware backend compiler",
        "distributed scalable redundant faulty stable experimental embedded legacy "
        "concurrent asynchronous",
        "deployed benchmarked refactored tested monitored patched profiled migrated",
    ),
    _topic(
        "marketing",
        "campaign brand audience newsletter launch survey logo slogan funnel conversion "
        "influencer webinar press poster banner strategy segment customer feedback sponsor",
        "viral seasonal targeted creative organic premium global local engaging bold",
        "launched promoted designed measured targeted published pitched rebranded",
    ),
    _topic(
        "legal",
        "agreement clause contract liability license patent trademark dispute settlement "
        "compliance policy privacy warranty court counsel signature amendment regulation "
        "arbitration lease",
        "confidential binding mutual exclusive statutory signed void amended international "
        "standard",
        "signed drafted negotiated terminated renewed filed disputed ratified",
    ),
    _topic(
        "health",
        "patient clinic nutrition vaccine therapy symptom diagnosis exercise sleep diet "
        "hospital prescription wellness recovery allergy heart muscle protein vitamin checkup",
        "chronic healthy daily clinical mild acute preventive balanced medical routine",
        "diagnosed treated prescribed monitored recovered measured scheduled examined",
    ),
    _topic(
        "cooking",
        "recipe pasta tomato garlic oven bread soup spice kitchen dessert chocolate salad "
        "sauce dinner breakfast flour butter lemon cheese noodle",
        "spicy crispy homemade fresh roasted sweet savory vegan creamy grilled",
        "baked roasted simmered tasted chopped served seasoned grilled",
    ),
    _topic(
        "nature",
        "forest river mountain bird flower garden tree wildlife ocean meadow canyon glacier "
        "butterfly fox deer waterfall volcano desert storm rainbow",
        "wild green misty ancient frozen blooming rocky golden dense vast",
        "photographed spotted planted observed mapped protected sketched recorded",
    ),
    _topic(
        "music",
        "album concert guitar piano melody rhythm lyrics playlist studio drummer chorus "
        "orchestra vinyl festival band podcast track microphone violin song",
        "acoustic live classical electronic upbeat mellow loud jazzy remastered instrumental",
        "recorded mixed performed composed rehearsed streamed produced tuned",
    ),
    _topic(
        "sports",
        "match team stadium coach league goal season tournament player training marathon "
        "bicycle racket helmet trophy referee sprint swimming football tennis",
        "final competitive regional professional amateur outdoor indoor winning fast olympic",
        "won trained coached organized played cheered qualified raced",
    ),
)

_PERIODS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "spring",
    "summer",
    "autumn",
    "winter",
]
_FIRST = [
    "Ada",
    "Alan",
    "Grace",
    "Linus",
    "Margaret",
    "Dennis",
    "Barbara",
    "Ken",
    "Frances",
    "Tim",
    "Radia",
    "Edsger",
]
_LAST = [
    "Lovelace",
    "Turing",
    "Hopper",
    "Torvalds",
    "Hamilton",
    "Ritchie",
    "Liskov",
    "Thompson",
    "Allen",
    "Berners",
]
_LABELS = (
    (0, "#00000000"),
    (1, "#E5484D"),
    (2, "#F76B15"),
    (3, "#FFC53D"),
    (4, "#30A46C"),
    (5, "#0090FF"),
    (6, "#8E4EC6"),
    (7, "#D6409F"),
    (8, "#8D8D8D"),
)
# kind -> (weight, [(mimeType, extension)], names of the thing)
_KINDS: dict[str, tuple[int, tuple[tuple[str | None, str | None], ...], tuple[str, ...]]] = {
    "document": (
        45,
        (
            ("application/pdf", "pdf"),
            ("application/vnd.openxmlformats-officedocument.wordprocessingml.document", "docx"),
            ("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "xlsx"),
            ("text/markdown", "md"),
        ),
        ("report", "summary", "notes", "draft", "proposal", "plan", "minutes", "checklist"),
    ),
    "image": (
        25,
        (
            ("image/jpeg", "jpg"),
            ("image/png", "png"),
            ("image/webp", "webp"),
            ("image/heic", "heic"),
        ),
        ("photo", "snapshot", "screenshot", "scan", "picture"),
    ),
    "video": (
        8,
        (("video/mp4", "mp4"), ("video/quicktime", "mov")),
        ("video", "clip", "recording"),
    ),
    "audio": (6, (("audio/mpeg", "mp3"), ("audio/mp4", "m4a")), ("interview", "episode", "memo")),
    "bookmark": (8, (("text/html", None),), ("article", "page", "guide")),
    "note": (5, (("text/markdown", "md"),), ("note", "idea", "todo")),
    "default": (3, ((None, None),), ("file", "item")),
}
_KIND_NAMES = tuple(_KINDS)
_KIND_WEIGHTS = tuple(v[0] for v in _KINDS.values())
_DOCUMENT_FIELDS = (
    "pages",
    "author",
    "title",
    "subject",
    "keywords",
    "producer",
    "creator",
    "security",
    "version",
    "creationDate",
    "modificationDate",
    "documentType",
    "structured",
)
_DOC_TYPES = {
    "finance": ("invoice", "invoice", "receipt", "statement"),
    "legal": ("contract", "contract", "agreement"),
}


class _Writer:
    """Builds English-ish sentences from a topic's word lists."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def sentence(self, topic: Topic) -> str:
        r = self.rng
        n1, n2, n3 = r.choice(topic.nouns), r.choice(topic.nouns), r.choice(topic.nouns)
        adj, verb = r.choice(topic.adjectives), r.choice(topic.verbs)
        period = r.choice(_PERIODS)
        template = r.randrange(6)
        if template == 0:
            text = f"the {adj} {n1} was {verb} by the {n2} team in {period}"
        elif template == 1:
            text = f"we {verb} the {n1} and the {adj} {n2} before the {n3} review"
        elif template == 2:
            text = f"{adj} {n1} notes from {period} cover the {n2} and its {n3}"
        elif template == 3:
            text = f"our {n1} {verb} every {adj} {n2} with a new {n3}"
        elif template == 4:
            text = f"a {adj} {n1} about {n2} was {verb} for the {period} {n3}"
        else:
            text = f"the {n1} of the {adj} {n2} was {verb} after the {n3} meeting"
        return text[0].upper() + text[1:] + "."

    def paragraph(self, topic: Topic, sentences: int) -> str:
        return " ".join(self.sentence(topic) for _ in range(sentences))


def _stamp(moment: datetime) -> str:
    return format_timestamp(moment)


def _maybe(rng: random.Random, chance: float, value: Any) -> Any:
    return value if rng.random() < chance else None


def _hex(rng: random.Random, n: int) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


@dataclass(frozen=True, slots=True)
class _Folder:
    id: str
    name: str | None
    root: dict[str, Any]
    chain: tuple[str, ...]  # this folder's id, then its ancestors' up to the root folder


def _users(rng: random.Random) -> list[dict[str, Any]]:
    users = []
    for i in range(10):
        uid = random_uuid(rng)
        users.append(
            {
                "id": uid,
                # A deleted account has no name; some people never upload a picture.
                "name": None if i == 9 else f"{_FIRST[i]} {_LAST[i]}",
                "pictureUrlCdn": None if i % 3 == 0 else f"{CDN_URL}/avatars/{uid}.png",
            }
        )
    return users


def _folders(rng: random.Random, users: Sequence[dict[str, Any]]) -> list[_Folder]:
    folders: list[_Folder] = []
    roots = (
        ("SYSTEM", "DEFAULT", False, "Workspace"),
        ("USER", "PRIVATE", True, "My files"),
        ("SHARED", "TEAM", False, None),
    )
    for root_type, subtype, private, title in roots:
        root_id = random_uuid(rng)
        top = random_uuid(rng)
        root = {
            "id": root_id,
            "type": root_type,
            "subtype": subtype,
            "isPrivate": private,
            "folder": {
                "id": top,
                "name": title,
                "isLocked": False,
                "isPasswordProtected": False,
                "user": rng.choice(users),
            },
        }
        folders.append(_Folder(top, title, root, (top,)))
        for topic in rng.sample(TOPICS, 4):
            fid = random_uuid(rng)
            name = _maybe(rng, 0.9, topic.name.capitalize())
            folder = _Folder(fid, name, root, (fid, top))
            folders.append(folder)
            for _ in range(rng.randrange(3)):
                sub = random_uuid(rng)
                sub_name = _maybe(rng, 0.9, f"{rng.choice(topic.nouns).capitalize()} archive")
                folders.append(_Folder(sub, sub_name, root, (sub, *folder.chain)))
    return folders


def _image_descriptor(
    rng: random.Random, url: str, known: bool, mime: str = "image/webp"
) -> dict[str, Any]:
    if not known:
        return {"url": url, "width": None, "height": None, "mime": None}
    width = rng.choice((640, 800, 1024, 1280, 1920, 2048))
    ratio_w, ratio_h = rng.choice(((16, 9), (4, 3), (1, 1), (3, 4)))
    return {"url": url, "width": width, "height": width * ratio_h // ratio_w, "mime": mime}


def _resource(
    rng: random.Random,
    writer: _Writer,
    users: Sequence[dict[str, Any]],
    folders: Sequence[_Folder],
    tags: Sequence[dict[str, str]],
    number: int,
) -> tuple[dict[str, Any], list[dict[str, Any]], tuple[str, ...]]:
    topic = rng.choice(TOPICS)
    kind = rng.choices(_KIND_NAMES, _KIND_WEIGHTS)[0]
    _, formats, things = _KINDS[kind]
    mime, extension = rng.choice(formats)
    rid = random_uuid(rng)
    created = _EPOCH + timedelta(
        seconds=rng.randrange(600 * 86400), milliseconds=rng.randrange(1000)
    )
    modified = created + timedelta(
        seconds=rng.randrange(45 * 86400), milliseconds=rng.randrange(1000)
    )
    c_at, m_at = _stamp(created), _stamp(modified)
    noun = rng.choice(topic.nouns)
    adjective = rng.choice(topic.adjectives)
    if kind == "image" and rng.random() < 0.1:
        name: str | None = f"IMG_{1000 + number % 9000}"
    else:
        name = f"{adjective.capitalize()} {noun} {rng.choice(things)}"
    name = _maybe(rng, 0.95, name)
    description = _maybe(rng, 0.6, writer.sentence(topic))
    is_file = kind not in ("bookmark", "note")
    size = rng.randrange(2_000, 25_000_000) if mime is not None and rng.random() < 0.95 else None
    visual = kind in ("image", "video")
    user = rng.choice(users)
    folder = rng.choice(folders)

    chunks: list[dict[str, Any]] = []
    if kind == "document":
        for seq in range(rng.randint(2, 6)):
            chunks.append(
                {
                    "text": writer.paragraph(topic, rng.randint(2, 4)),
                    "sequence": seq,
                    "pageNumber": 1 + seq // 2,
                    "timeStart": 0.0,
                    "timeEnd": 0.0,
                }
            )
    elif kind in ("video", "audio"):
        start = 0.0
        for seq in range(rng.randint(2, 4)):
            length = round(rng.uniform(8.0, 40.0), 2)
            chunks.append(
                {
                    "text": writer.paragraph(topic, 2),
                    "sequence": seq,
                    "pageNumber": 0,
                    "timeStart": round(start, 2),
                    "timeEnd": round(start + length, 2),
                }
            )
            start += length
    elif kind in ("bookmark", "note") or (kind == "image" and rng.random() < 0.3):
        for seq in range(rng.randint(1, 2)):
            chunks.append(
                {
                    "text": writer.paragraph(topic, rng.randint(1, 3)),
                    "sequence": seq,
                    "pageNumber": 1,
                    "timeStart": 0.0,
                    "timeEnd": 0.0,
                }
            )

    comment_created = created + timedelta(hours=rng.randrange(1, 72))
    anonymous = rng.random() < 0.2
    doc_attrs: dict[str, Any]
    if kind == "document":
        doc_type = rng.choice(_DOC_TYPES.get(topic.name, ("report", "letter", "other")))
        structured = (
            {
                "invoiceNumber": f"INV-{created.year}-{number:05d}",
                "total": round(rng.uniform(20, 9000), 2),
                "currency": rng.choice(("EUR", "USD", "GBP")),
                "dueDate": _stamp(created + timedelta(days=30)),
            }
            if doc_type == "invoice"
            else None
        )
        doc_attrs = {
            "pages": max(1, len(chunks) // 2 + rng.randrange(3)),
            "author": _maybe(rng, 0.8, rng.choice(users)["name"]),
            "title": _maybe(rng, 0.8, name),
            "subject": _maybe(rng, 0.5, f"{topic.name.capitalize()} {noun}"),
            "keywords": _maybe(rng, 0.5, ", ".join(rng.sample(topic.nouns, 3))),
            "producer": _maybe(
                rng,
                0.7,
                rng.choice(("Skia/PDF m120", "macOS Quartz PDFContext", "LibreOffice 7.6")),
            ),
            "creator": _maybe(
                rng, 0.7, rng.choice(("Microsoft Word", "Pages", "Google Docs", "Writer"))
            ),
            "security": _maybe(rng, 0.6, rng.random() < 0.05),
            "version": _maybe(rng, 0.7, rng.choice(("1.4", "1.5", "1.7", "2.0"))),
            "creationDate": _maybe(rng, 0.7, c_at),
            "modificationDate": _maybe(rng, 0.6, m_at),
            "documentType": doc_type,
            "structured": structured,
        }
    else:
        doc_attrs = dict.fromkeys(_DOCUMENT_FIELDS)
        doc_attrs["documentType"] = "other"
    cover = _image_descriptor(rng, f"{CDN_URL}/covers/{rid}.webp", visual or rng.random() < 0.4)
    width = cover["width"] if visual else None
    height = cover["height"] if visual else None
    slug = (name or "untitled").lower().replace(" ", "-")
    label_id, hex_color = _LABELS[0] if rng.random() < 0.5 else rng.choice(_LABELS[1:])

    wire: dict[str, Any] = {
        "id": rid,
        "kind": kind,
        "mimeType": mime,
        "extension": extension,
        "name": name,
        "description": description,
        "size": size,
        "url": f"https://app.example.com/resources/{rid}",
        "commentPinned": {
            "id": random_uuid(rng),
            "content": writer.sentence(topic),
            "createdAt": _stamp(comment_created),
            "modifiedAt": _stamp(comment_created + timedelta(minutes=rng.randrange(0, 600))),
            "resourceId": rid,
            "anonymousIdentity": {
                "displayName": f"Guest {rng.randrange(100, 999)}" if anonymous else None,
                "sessionHash": _hex(rng, 32) if anonymous else None,
            },
            "user": rng.choice(users),
            "mentionedUsers": rng.sample(list(users), rng.choice((0, 0, 1, 2))),
        },
        "label": {"id": label_id, "hexColor": hex_color},
        "parent": {"id": folder.id, "name": folder.name},
        "cover": cover,
        "user": user,
        "root": folder.root,
        "stateProcessing": rng.choices(("done", "processing", "pending", "failed"), (85, 7, 5, 3))[
            0
        ],
        "originUrl": (
            f"https://{rng.choice(('news', 'blog', 'docs', 'www'))}.example.org/{topic.name}/{slug}"
            if kind == "bookmark" or rng.random() < 0.15
            else None
        ),
        "tags": rng.sample(list(tags), rng.choice((0, 0, 1, 1, 2, 3, 4))),
        "chats": [
            {
                "id": random_uuid(rng),
                "name": _maybe(rng, 0.7, f"Questions about {noun}"),
                "isPinned": rng.random() < 0.3,
                "createdAt": _stamp(created + timedelta(days=i + 1)),
                "modifiedAt": _stamp(created + timedelta(days=i + 2)),
                "agent": {"id": random_uuid(rng)},
            }
            for i in range(rng.choice((0, 0, 0, 1, 2)))
        ],
        "thumbnail": {
            size_name: f"{CDN_URL}/thumbnails/{rid}/{size_name}.webp"
            for size_name in ("sm", "md", "lg", "xl", "original")
        },
        "fileUrl": f"{FILES_URL}/files/{rid}/{slug}.{extension or 'bin'}" if is_file else None,
        "preferences": (
            json.dumps({"view": rng.choice(("grid", "list")), "zoom": rng.choice((1, 2))})
            if rng.random() < 0.15
            else None
        ),
        "isPasswordProtected": rng.random() < 0.05,
        "isLocked": rng.random() < 0.05,
        "publishedAncestors": (
            [{"resourceId": folder.chain[-1], "accessToken": _hex(rng, 40)}]
            if rng.random() < 0.1
            else []
        ),
        "createdAt": c_at,
        "modifiedAt": m_at,
        "data": {
            "infected": rng.random() < 0.01,
            "documentPreview": {
                "html": (
                    f"<h1>{name or 'Untitled'}</h1><p>{chunks[0]['text']}</p>"
                    if kind == "document" and chunks and rng.random() < 0.7
                    else None
                )
            },
            "caption": _maybe(rng, 0.9 if visual else 0.4, writer.sentence(topic)),
            "keywords": rng.sample(topic.nouns, rng.randrange(0, 5)),
            "attributes": {
                "document": doc_attrs,
                "dimensions": {"width": width, "height": height},
                "cover": cover,
            },
            "pdfRender": {
                "storagePath": f"renders/{rid}.pdf",
                "url": f"{FILES_URL}/renders/{rid}.pdf",
            },
        },
    }
    ancestors = (*folder.chain, folder.root["id"])
    return wire, chunks, ancestors


def _job(
    rng: random.Random,
    writer: _Writer,
    workspace_id: str,
    users: Sequence[dict[str, Any]],
    number: int,
) -> dict[str, Any]:
    topic = rng.choice(TOPICS)
    kind = rng.choices(("document", "image", "video", "audio", "web"), (45, 20, 10, 10, 15))[0]
    jid = random_uuid(rng)
    created = _EPOCH + timedelta(
        seconds=rng.randrange(600 * 86400), milliseconds=rng.randrange(1000)
    )
    c_at = _stamp(created)
    noun = rng.choice(topic.nouns)
    base = f"{FILES_URL}/extractions/{jid}"
    is_media = kind in ("image", "video")
    has_sound = kind in ("video", "audio")
    slug = f"{topic.name}-{noun}-{number}"
    web_url = f"https://www.example.org/{topic.name}/{slug}"
    mime = {
        "document": "application/pdf",
        "image": "image/jpeg",
        "video": "video/mp4",
        "audio": "audio/mpeg",
        "web": "text/html",
    }[kind]
    width = rng.choice((640, 1280, 1920, 3024)) if is_media else None
    caption = writer.sentence(topic)
    doc_type = rng.choice(_DOC_TYPES.get(topic.name, ("report", "letter", "other")))
    is_doc = kind == "document"
    return {
        "id": jid,
        "workspaceId": workspace_id,
        "userId": rng.choice(users)["id"],
        "kind": kind,
        "name": _maybe(rng, 0.85, f"{noun.capitalize()} {kind} {number}"),
        "url": web_url if kind == "web" else _maybe(rng, 0.2, f"{FILES_URL}/uploads/{slug}"),
        "state": rng.choices(("done", "processing", "pending", "failed"), (65, 10, 10, 15))[0],
        "createdAt": c_at,
        "extraction": {
            "common": {
                "mimeType": _maybe(rng, 0.95, mime),
                "size": _maybe(rng, 0.9, rng.randrange(5_000, 40_000_000)),
                "infected": rng.random() < 0.01,
                "caption": caption,
                "keywords": rng.sample(topic.nouns, rng.randrange(1, 6)),
                "thumbnail": f"{base}/thumbnail.webp",
                "chunkCount": rng.randrange(0, 40),
            },
            "media": {
                "width": width,
                "height": width * 3 // 4 if width else None,
                "duration": round(rng.uniform(5, 3600), 3) if has_sound else None,
                "codec": rng.choice(("h264", "hevc", "vp9"))
                if kind == "video"
                else ("aac" if kind == "audio" else None),
                "bitRate": rng.randrange(96_000, 8_000_000) if has_sound else None,
                "frameRate": rng.choice((24.0, 25.0, 29.97, 30.0, 60.0))
                if kind == "video"
                else None,
                "sampleRate": rng.choice((44_100, 48_000)) if has_sound else None,
                "channels": rng.choice((1, 2)) if has_sound else None,
                "color": {
                    "profile": rng.choice(("sRGB IEC61966-2.1", "Display P3"))
                    if is_media
                    else None,
                    "space": rng.choice(("RGB", "YUV")) if is_media else None,
                    "alphaChannel": (rng.random() < 0.2) if kind == "image" else None,
                    "pixelFormat": rng.choice(("rgb24", "yuv420p")) if is_media else None,
                },
                "location": {
                    "latitude": round(rng.uniform(-60, 70), 6)
                    if is_media and rng.random() < 0.5
                    else None,
                    "longitude": round(rng.uniform(-180, 180), 6)
                    if is_media and rng.random() < 0.5
                    else None,
                },
                "device": {
                    "maker": rng.choice(("Apple", "Canon", "Google")) if is_media else None,
                    "model": rng.choice(("iPhone 15", "EOS R6", "Pixel 8")) if is_media else None,
                    "software": _maybe(rng, 0.6, "17.4.1") if is_media else None,
                },
                "dominantColors": [
                    {
                        "rgb": [rng.randrange(256), rng.randrange(256), rng.randrange(256)],
                        "score": round(rng.uniform(0.05, 0.6), 4),
                    }
                    for _ in range(3 if is_media else 0)
                ],
                "ocr": writer.sentence(topic) if kind == "image" and rng.random() < 0.5 else "",
                "screenshot": {
                    "url": f"{base}/screenshot.webp",
                    "width": 1280 if kind == "web" else None,
                    "height": 800 if kind == "web" else None,
                    "mime": "image/webp" if kind == "web" else None,
                },
                "transcript": {
                    "url": f"{base}/transcript.vtt",
                    "size": rng.randrange(500, 90_000) if has_sound else None,
                    "mime": "text/vtt" if has_sound else None,
                },
            },
            "document": {
                "pages": rng.randint(1, 60) if is_doc else 0,
                "author": (rng.choice(users)["name"] or "") if is_doc else "",
                "title": f"{noun.capitalize()} {doc_type}" if is_doc else "",
                "subject": topic.name if is_doc else "",
                "creator": "Microsoft Word" if is_doc else "",
                "producer": "macOS Quartz PDFContext" if is_doc else "",
                "version": "1.7" if is_doc else "",
                "security": is_doc and rng.random() < 0.05,
                "creationDate": c_at,
                "modificationDate": _stamp(created + timedelta(minutes=rng.randrange(1, 5000))),
                "pdfRender": {
                    "url": f"{base}/render.pdf",
                    "size": rng.randrange(10_000, 9_000_000) if is_doc else None,
                    "mime": "application/pdf" if is_doc else None,
                },
                "documentType": doc_type if is_doc else "other",
                "structured": (
                    {
                        "invoiceNumber": f"INV-{created.year}-{number:05d}",
                        "total": round(rng.uniform(20, 9000), 2),
                        "currency": "EUR",
                    }
                    if is_doc and doc_type == "invoice"
                    else {}
                ),
            },
            "web": {
                "title": f"{noun.capitalize()} - {topic.name} news" if kind == "web" else "",
                "siteName": "Example News" if kind == "web" else "",
                "description": caption if kind == "web" else "",
                "url": web_url if kind == "web" else "",
                "image": {
                    "url": f"https://www.example.org/images/{slug}.jpg" if kind == "web" else "",
                    "width": 1200 if kind == "web" else None,
                    "height": 630 if kind == "web" else None,
                    "mime": "image/jpeg" if kind == "web" else None,
                },
                "favicon": {
                    "url": "https://www.example.org/favicon.ico" if kind == "web" else "",
                    "width": 32 if kind == "web" else None,
                    "height": 32 if kind == "web" else None,
                    "mime": "image/x-icon" if kind == "web" else None,
                },
                "html": {
                    "url": f"{base}/page.html",
                    "size": rng.randrange(5_000, 400_000) if kind == "web" else None,
                    "mime": "text/html" if kind == "web" else None,
                },
                "reader": {
                    "url": f"{base}/reader.html",
                    "size": rng.randrange(2_000, 100_000) if kind == "web" else None,
                    "mime": "text/html" if kind == "web" else None,
                },
            },
        },
        "links": {"chunks": f"{base}/chunks.json", "download": f"{base}/download"},
    }


_FAILURES = (
    (500, "HTTP 500 Internal Server Error", "Internal Server Error"),
    (502, "HTTP 502 Bad Gateway", "<html><body><h1>502 Bad Gateway</h1></body></html>"),
    (503, "HTTP 503 Service Unavailable", "Service Unavailable"),
    (None, "timeout after 10s waiting for a response", None),
    (None, "connection refused", None),
    (410, "HTTP 410 Gone", '{"error":"endpoint removed"}'),
)


def _webhook_logs(rng: random.Random, job: dict[str, Any]) -> list[dict[str, Any]]:
    state = job["state"]
    created = datetime.fromisoformat(job["createdAt"])
    trace = random_uuid(rng)
    event = "extraction.failed" if state == "failed" else "extraction.completed"
    payload = json.dumps(
        {"event": event, "jobId": job["id"], "state": state, "createdAt": job["createdAt"]},
        separators=(",", ":"),
    )
    if state == "pending":
        plan = [] if rng.random() < 0.5 else ["pending"]
    elif state == "processing":
        plan = ["pending"] if rng.random() < 0.5 else []
    elif state == "done":
        plan = ["failed"] * rng.choice((0, 0, 1, 2, 3)) + ["success"]
    else:
        plan = ["failed"] * rng.randint(1, 3) + (["success"] if rng.random() < 0.5 else [])
    logs = []
    moment = created + timedelta(seconds=rng.randrange(5, 600))
    for attempt, status in enumerate(plan, start=1):
        moment += timedelta(seconds=2**attempt * 15, milliseconds=rng.randrange(1000))
        if status == "success":
            code: int | None = rng.choice((200, 200, 200, 202, 204))
            error = None
            body: str | None = '{"received":true}' if code != 204 else None
        elif status == "failed":
            code, error, body = rng.choice(_FAILURES)
        else:
            code, error, body = None, None, None
        logs.append(
            {
                "id": random_uuid(rng),
                "traceId": trace,
                "attemptNumber": attempt,
                "status": status,
                "statusCode": code,
                "errorMessage": error,
                "firedAt": None if status == "pending" else _stamp(moment),
                "createdAt": _stamp(moment - timedelta(milliseconds=rng.randrange(1, 900))),
                "requestPayload": payload if status != "pending" or rng.random() < 0.5 else None,
                "responseBody": body,
            }
        )
    return logs


# Seeded bases by (n_resources, n_jobs, seed, workspace id), so a test suite that starts a
# seeded emulator per test builds the data once; kept small and only for small bases.
_CACHE: OrderedDict[tuple[int, int, int, str], BaseData] = OrderedDict()
_CACHE_ENTRIES = 8
_CACHE_MAX_RESOURCES = 2_000


def _clone(data: BaseData) -> BaseData:
    jobs = {}
    for job_id, record in data.jobs.items():
        # A JSON round trip is the fastest deep copy of plain wire data.
        wire = msgspec.json.decode(msgspec.json.encode(record.wire))
        logs = msgspec.json.decode(msgspec.json.encode(record.logs))
        jobs[job_id] = JobRecord(wire=wire, next_states=deque(record.next_states), logs=logs)
    return BaseData(index=data.index.clone(), jobs=jobs)


def seed_base(
    store: Store, *, n_resources: int, n_jobs: int, seed: int, base_id: str | None
) -> None:
    """Add ``n_resources`` resources and ``n_jobs`` jobs (with webhook logs) made from ``seed``."""
    if n_resources < 0 or n_jobs < 0:
        raise ValueError("n_resources and n_jobs must not be negative")
    key = (n_resources, n_jobs, seed, store.workspace.id)
    target = store.bases.get(base_id)
    empty = target is None or (not target.index.docs and not target.jobs)
    if empty and key in _CACHE:
        _CACHE.move_to_end(key)
        store.bases[base_id] = _clone(_CACHE[key])
        return
    _generate(store.base(base_id), store, n_resources, n_jobs, seed, base_id)
    if empty and n_resources <= _CACHE_MAX_RESOURCES:
        _CACHE[key] = _clone(store.base(base_id))
        while len(_CACHE) > _CACHE_ENTRIES:
            _CACHE.popitem(last=False)


def _generate(
    data: BaseData, store: Store, n_resources: int, n_jobs: int, seed: int, base_id: str | None
) -> None:
    rng = random.Random(seed)
    writer = _Writer(rng)
    users = _users(rng)
    folders = _folders(rng, users)
    tags = [
        {"id": random_uuid(rng), "name": word}
        for word in (
            "urgent",
            "archive",
            "q1",
            "q2",
            "q3",
            "q4",
            "review",
            "personal",
            "shared",
            "draft",
            "final",
            "important",
            "todo",
            "reference",
            "2023",
            "2024",
        )
    ]
    for number in range(n_resources):
        wire, chunks, ancestors = _resource(rng, writer, users, folders, tags, number)
        data.index.add(wire, chunks, ancestors)
    for number in range(n_jobs):
        job = _job(rng, writer, store.workspace.id, users, number)
        store.add_job(job, base_id=base_id, strict=False)
        for log in _webhook_logs(rng, job):
            store.add_webhook_log(job["id"], log, base_id=base_id, strict=False)


def seed_pages(store: Store) -> list[str]:
    """Register a few link preview pages (Open Graph, plain HTML, relative URLs); return URLs."""
    pages = {
        "https://www.example.org/articles/harbor-sunset": """<!doctype html>
<html><head>
<title>Sunset at the harbor | Example News</title>
<meta property="og:title" content="Sunset at the harbor">
<meta property="og:type" content="article">
<meta property="og:description" content="A scenic evening walk along the old harbor.">
<meta property="og:site_name" content="Example News">
<meta property="og:image" content="https://www.example.org/images/harbor.jpg">
<meta property="og:image:width" content="1200">
<meta property="og:image:height" content="630">
<meta property="og:image:type" content="image/jpeg">
<meta name="author" content="Grace Hopper">
<meta name="twitter:card" content="summary_large_image">
<link rel="icon" type="image/png" sizes="32x32" href="/static/favicon-32.png">
</head><body><h1>Sunset at the harbor</h1><p>Boats and light.</p></body></html>""",
        "https://docs.example.org/guide/quickstart": """<!doctype html>
<html><head>
<title>Quickstart guide</title>
<meta name="description" content="Install the client and run your first search.">
<meta name="viewport" content="width=device-width, initial-scale=1">
</head><body><p>Hello.</p></body></html>""",
        "https://video.example.org/watch/42": """<html><head>
<meta property="og:title" content="Live concert recording">
<meta property="og:type" content="video.other">
<meta property="og:image" content="/thumbs/42.png">
<meta property="og:image:type" content="image/png">
<meta property="og:site_name" content="Example Video">
<link rel="shortcut icon" href="https://cdn.example.org/icons/video.ico">
</head><body></body></html>""",
    }
    for url, html in pages.items():
        store.add_page(url, html)
    return list(pages)
