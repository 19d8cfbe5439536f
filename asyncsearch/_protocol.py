"""The service's protocol without I/O: arguments in, request values out; status, headers, body in,
a typed model or a typed error out.

Nothing here touches the network or an event loop, so every rule can be tested with plain values:
validation of arguments against the spec's limits, request building, response decoding, error
mapping, ``Retry-After`` parsing, the retry decision and backoff, and the same-origin redirect rule.
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import ipaddress
import math
import mimetypes
import os
import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import suppress
from functools import partial
from http.client import responses
from typing import Any, Generic, TypedDict, TypeVar, Unpack, get_args
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy

from . import _errors
from . import _models as models
from ._checks import check_number
from ._errors import ConfigurationError, InvalidRequestError

T = TypeVar("T")

MAX_TEXT_LENGTH = 255
MAX_IMAGE_LENGTH = 600_000
# The spec's pattern. fullmatch, not "$": "$" would also accept a trailing newline.
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# The closed sets are named once, as Literal types in _models.
_EXTRACTION_FORMATS: tuple[models.ExtractionFormat, ...] = get_args(models.ExtractionFormat)
_LINK_TYPES: tuple[models.LinkType, ...] = get_args(models.LinkType)
#: Answers that say the request was not acted on (the server did not get all of it, refused it
#: for its rate, or could not take it at all), so that any request may be sent again.
NOT_ACTED_ON_STATUSES = frozenset({408, 429, 503})


class _DefaultRetryableStatuses(frozenset[int]):
    """408, 429 and every 5xx: a ``frozenset`` whose repr says so in one line.

    The plain repr lists 102 numbers, which is what ``help(RetryPolicy)``, the signature of
    ``AsyncSearchClient`` and ``repr(RetryPolicy())`` showed. The repr is valid Python for an
    equal set.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "frozenset({408, 429, *range(500, 600)})"


#: The statuses retried by default (``RetryPolicy.statuses``): 408, 429 and every 5xx.
RETRYABLE_STATUSES: frozenset[int] = _DefaultRetryableStatuses({408, 429, *range(500, 600)})


# ---------------------------------------------------------------------------------------------
# Values that cross the seam to the transport
# ---------------------------------------------------------------------------------------------


# Request and Response are made once per call and per attempt: frozen msgspec Structs, not
# frozen dataclasses, whose __init__ sets every field through object.__setattr__ (~2.3 us each
# against ~0.2 us, measured). Untracked by the cyclic GC: nothing in them refers back to them.
class Request(msgspec.Struct, Generic[T], frozen=True, gc=False):
    """One endpoint call, ready to send: ``target`` is the encoded path and query under base_url."""

    method: str
    target: str
    body: bytes | None
    parse: Callable[[bytes], T]
    #: The endpoint's name in logs and fault injection: "search", "extract", ...
    endpoint: str = ""
    #: Whether sending it twice has the effect of sending it once. Every GET is; a search is
    #: only when ``incognito`` (otherwise each one that reaches the service adds a history
    #: entry). A request that is not is retried only after failures that show it was not acted
    #: on (see ``is_retryable_status`` and ``is_retryable_connection_error``).
    idempotent: bool = True

    @property
    def path(self) -> str:
        """The endpoint's path, for logs: the target without its query (which may hold a URL)."""
        return self.target.partition("?")[0]


class Response(msgspec.Struct, frozen=True, gc=False):
    """What came back for one attempt: status, headers and the whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str
    elapsed: float = 0.0


# ---------------------------------------------------------------------------------------------
# Validation of arguments
# ---------------------------------------------------------------------------------------------


def validate_id(name: str, value: object) -> str:
    """Return the id as the string to send, or raise if it does not match the spec's UUID pattern.

    A ``uuid.UUID`` is accepted and turned into its string.
    """
    # Because every id must match the pattern, no caller-supplied string can change the path of
    # a request (the builders put ids in paths without percent-encoding them).
    if isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise _must_be(name, "a UUID string or uuid.UUID", value)
    if not _UUID_RE.fullmatch(value):
        raise InvalidRequestError(
            f"{name} must match the UUID pattern ^{_UUID_RE.pattern}$ (lowercase hex), "
            f"got {value if len(value) <= 60 else value[:60] + '...'!r}"
        )
    return value


def _must_be(name: str, what: str, value: object) -> InvalidRequestError:
    return InvalidRequestError(f"{name} must be {what}, got {type(value).__name__}")


def _validate_text(
    name: str, value: object, limit: int = MAX_TEXT_LENGTH, what: str = "a string"
) -> str:
    if not isinstance(value, str):
        raise _must_be(name, what, value)
    if len(value) > limit:
        raise InvalidRequestError(f"{name} is {len(value)} characters long; the limit is {limit}")
    return value


def _validate_image(name: str, value: object) -> str:
    what = "a data URL string (see asyncsearch.image_data_url)"
    value = _validate_text(name, value, MAX_IMAGE_LENGTH, what)
    if not (value.startswith("data:") and ";base64," in value[:200]):
        raise InvalidRequestError(
            f"{name} must be a base64 data URL such as 'data:image/png;base64,...' "
            "(asyncsearch.image_data_url makes one)"
        )
    return value


def _validate_precision(name: str, value: object) -> float:
    # NaN and infinities fail the range test too.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidRequestError(f"{name} must be a number from 0 to 1 inclusive, got {value!r}")
    return float(value)


def _validate_list(name: str, value: object, kind: type[str] | type[int]) -> list[Any]:
    """A list of non-empty strings (``uuid.UUID`` taken as its string) or of integers."""
    what, one = ("strings", "a non-empty string") if kind is str else ("integers", "an integer")
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
        raise InvalidRequestError(f"{name} must be a list of {what}, got {value!r}")
    out: list[Any] = []
    for i, item in enumerate(value):
        if kind is str and isinstance(item, uuid.UUID):
            item = str(item)
        if isinstance(item, bool) or not isinstance(item, kind) or item == "":
            raise InvalidRequestError(f"{name}[{i}] must be {one}, got {item!r}")
        out.append(item)
    return out


def _validate_timestamp(name: str, value: object) -> datetime.datetime | str:
    if isinstance(value, str) and value:
        return value
    if not isinstance(value, datetime.datetime) or value.utcoffset() is None:
        raise InvalidRequestError(
            f"{name} must be a timezone-aware datetime (a naive one is ambiguous) or a non-empty "
            f"ISO 8601 string, got {value!r}"
        )
    # Sent as ISO 8601 in UTC with "Z".
    try:
        return value.astimezone(datetime.UTC)
    except OverflowError:
        raise InvalidRequestError(f"{name} is out of range in UTC, got {value!r}") from None


def _fields_from(name: str, value: object, struct_type: type[msgspec.Struct]) -> dict[str, object]:
    """Read a Struct or a plain dict (Python or wire key names) into a dict of Python names."""
    if isinstance(value, struct_type):
        return msgspec.structs.asdict(value)
    if not isinstance(value, Mapping):
        raise _must_be(name, f"an asyncsearch.{struct_type.__name__} or a dict", value)
    fields = struct_type.__struct_fields__
    names = _wire_names(struct_type) | dict(zip(fields, fields, strict=True))
    for key in value:
        if key not in names:
            allowed = ", ".join(fields)
            raise InvalidRequestError(f"{name} has an unknown key {key!r}; allowed: {allowed}")
    return {names[key]: item for key, item in value.items()}


def _wire_names(struct_type: type[msgspec.Struct]) -> dict[str, str]:
    """Each field's wire name -> its Python name."""
    return {field.encode_name: field.name for field in msgspec.structs.fields(struct_type)}


def _known_fields(body: Mapping[str, Any], struct_type: type[msgspec.Struct]) -> dict[str, Any]:
    """The fields of ``struct_type`` set in a wire-named ``body``, by their Python names."""
    names = _wire_names(struct_type)
    return {names[key]: item for key, item in body.items() if key in names and item is not None}


def _normalize_filters(name: str, value: object) -> models.SearchFilters:
    checked: dict[str, Any] = {}
    for key, item in _fields_from(name, value, models.SearchFilters).items():
        if item is None:
            continue
        if key in ("created_after", "created_before"):
            checked[key] = _validate_timestamp(f"{name}.{key}", item)
        else:
            checked[key] = _validate_list(f"{name}.{key}", item, int if key == "color" else str)
    return models.SearchFilters(**checked)


def _normalize_sort(value: object) -> models.Sort:
    raw: dict[str, Any] = _fields_from("sort", value, models.Sort)
    for key in ("field", "order"):
        item = raw.get(key)
        if (key == "field" or item is not None) and (not isinstance(item, str) or not item):
            raise InvalidRequestError(f"sort.{key} must be a non-empty string, got {item!r}")
    return models.Sort(**raw)


#: The checks of the fields a search and each of its ``queries`` share, in the order they run.
_QUERY_CHECKS: dict[str, Callable[[str, object], object]] = {
    "text": _validate_text,
    "image": _validate_image,
    "resource_id": validate_id,
    "filters": _normalize_filters,
    "precision": _validate_precision,
}


def _check_query_fields(prefix: str, raw: Mapping[str, object]) -> dict[str, Any]:
    return {
        key: check(prefix + key, raw[key])
        for key, check in _QUERY_CHECKS.items()
        if raw.get(key) is not None
    }


def _normalize_queries(value: object) -> list[models.SearchQuery]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise _must_be("queries", "a list", value)
    return [
        models.SearchQuery(
            **_check_query_fields(
                f"queries[{i}].", _fields_from(f"queries[{i}]", q, models.SearchQuery)
            )
        )
        for i, q in enumerate(value)
    ]


def _opt(value: object, check: Callable[[object], T]) -> T | None:
    return None if value is None else check(value)


# ---------------------------------------------------------------------------------------------
# Request builders, one per endpoint
# ---------------------------------------------------------------------------------------------

_search_page_decoder = msgspec.json.Decoder(models.SearchPage)
_search_page_head_decoder = msgspec.json.Decoder(models.SearchPageHead)
_extraction_job_decoder = msgspec.json.Decoder(models.ExtractionJob)
_link_preview_decoder = msgspec.json.Decoder(models.LinkPreview)
_webhook_log_list_decoder = msgspec.json.Decoder(models.WebhookLogList)
_webhook_log_decoder = msgspec.json.Decoder(models.WebhookLog)


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """Decode a success body with a typed decoder; any mismatch is a ``ResponseValidationError``."""
    try:
        if body:
            return decoder.decode(body)
        problem = "is empty"
    except msgspec.ValidationError as exc:
        match = re.fullmatch(r"(.*) - at `(\$[^`]*)`", str(exc), flags=re.DOTALL)
        reason, path = (match.group(1), match.group(2)) if match else (str(exc), "$")
        fits = getattr(decoder.type, "__name__", str(decoder.type))
        message = f"the response body does not fit {fits} at {path}: {reason}"
        raise _errors.ResponseValidationError(message, path=path, body=body) from None
    except msgspec.DecodeError as exc:
        problem = f"is not valid JSON: {exc}"
    except UnicodeDecodeError as exc:
        # msgspec reports invalid UTF-8 inside a string as the bare codec error. It holds the
        # whole body, so it is raised outside this block, where it is not kept as __context__.
        problem = f"is not valid UTF-8 JSON: {exc.reason} at byte {exc.start}"
    except RecursionError:
        problem = "is JSON nested deeper than the decoder can follow"
    raise _errors.ResponseValidationError(f"the response body {problem}", path=None, body=body)


#: How much of a body that is not JSON an error quotes.
NOT_JSON_QUOTE = 80


def explain_not_json(
    error: _errors.ResponseValidationError,
    *,
    status: int,
    content_type: str | None,
    url: str,
    secrets: Secrets,
) -> None:
    """Make the error of a success answer whose body is not JSON say what came instead.

    An HTML page answered with 200 (a proxy's login page, a wrong ``base_url``) said only "the
    response body is not valid JSON: ..."; the message now names the status, the content type,
    the URL and the first ``NOT_JSON_QUOTE`` characters of the body, with the key scrubbed (a
    debug page may echo the request's headers). An error of a JSON body that does not fit the
    model (``error.path`` set) is left as it is.

    Args:
        error: The error ``decode_body`` raised.
        status: The answer's status.
        content_type: The answer's ``Content-Type``, or ``None`` when it had none.
        url: The URL the answer came from.
        secrets: The call's secrets, scrubbed from what is quoted.
    """
    if error.path is not None:
        return
    # A window longer by a secret's length: one cut at the quote's end is still scrubbed whole.
    longest = max(map(len, secrets.texts), default=0)
    window = error.body[: NOT_JSON_QUOTE + longest].decode("utf-8", "replace")
    text = " ".join(secrets.redact(window).split())
    start = text[:NOT_JSON_QUOTE] + ("..." if len(text) > NOT_JSON_QUOTE else "")
    what = content_type or "no Content-Type"
    quote = f"it starts with {start!r}" if start else "it is empty"
    problem = error.message.removeprefix("the response body ")
    error.message = f"the {status} answer of {url} ({what}) {problem}; {quote}"
    error.args = (error.message,)


def _parse_search_page(body: bytes) -> models.SearchPage:
    # Each hit keeps its embeddings as the raw JSON (msgspec.Raw, referencing ``body``) and
    # decodes them on first read: SearchHit.embeddings.
    return decode_body(_search_page_decoder, body)


def _parse_search_page_without_embeddings(body: bytes) -> models.SearchPage:
    page = decode_body(_search_page_decoder, body)
    # Dropping the raw slices lets ``body`` be freed once the caller drops it: no hit refers to
    # it any more. They are not validated (nothing is read from them), as when skipped.
    for hit in page.hits:
        hit.embeddings = None
    return page


def search_page_head(body: bytes) -> models.SearchPageHead:
    """Read a search answer's ``total``, ``hasMore`` and hit ids, skipping everything else.

    Raises ``ResponseValidationError`` like the full decode when the body does not fit.
    """
    # About a third of the time of the full decode of a page with embeddings.
    return decode_body(_search_page_head_decoder, body)


class _SearchPageStart(msgspec.Struct, rename="camel"):
    total: int
    has_more: bool


_search_page_start_decoder = msgspec.json.Decoder(_SearchPageStart)


def search_page_continues(body: bytes) -> bool:
    """Whether a search answer says ``hasMore`` and holds hits, read from its first bytes only.

    The service writes ``total``, ``hasMore``, then ``hits``: the fields before ``"hits":`` are
    decoded by msgspec as an object of their own, and ``hits`` must open with a hit. Any other
    shape (another key order, spaces, a nested ``hits``) reads ``False``: only a hint, on which
    a walk sends the next request before it reads the page; the page's view still decides.
    """
    cut = body.find(b'"hits":[{', 0, 256)
    try:
        return cut > 0 and _search_page_start_decoder.decode(body[:cut] + b'"_":0}').has_more
    except msgspec.DecodeError:
        return False


def _parse_webhook_log_list(body: bytes) -> list[models.WebhookLogSummary]:
    return decode_body(_webhook_log_list_decoder, body).items


# Declared once for every search method: with ``text`` (positional) and ``page``
# (``SearchParams``) these are the ten search arguments.
class SearchWalkParams(TypedDict, total=False):
    """The keyword arguments of a search walk (``search_pages``, ``search_hits``).

    Every one may be left out or ``None`` (not sent).
    """

    image: str | None
    """A picture as a data URL (``image_data_url``): find resources that look like it."""
    resource_id: str | uuid.UUID | None
    """Find resources similar to this one."""
    filters: models.SearchFilters | Mapping[str, Any] | None
    """``SearchFilters``, or a dict with its keys: kinds, dates, labels, ..."""
    precision: float | None
    """From 0 to 1: how closely hits must match."""
    queries: Sequence[models.SearchQuery | Mapping[str, Any]] | None
    """More queries, each a ``SearchQuery`` or a dict with its keys."""
    incognito: bool | None
    """Keep the search out of the history (and make it safe to retry)."""
    page_size: int | None
    """Hits per page."""
    sort: models.Sort | Mapping[str, Any] | None
    """A ``Sort``, or a dict with its keys (``field``, ``order``)."""


class SearchParams(SearchWalkParams, total=False):
    """The keyword arguments of ``search``: those of a walk plus ``page``."""

    page: int | None


_SEARCH_PARAMS = frozenset(SearchParams.__annotations__)


def check_search_params(function: str, params: Mapping[str, object], *, page: bool) -> None:
    """Refuse a keyword that is not a search argument, as Python does for a plain signature."""
    allowed = _SEARCH_PARAMS if page else _SEARCH_PARAMS - {"page"}
    for name in params:
        if name not in allowed:
            hint = " (use start_page=)" if name == "page" else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")


def search(text: str | None = None, **params: Unpack[SearchParams]) -> Request[models.SearchPage]:
    """Build ``POST /v2/search``; raises ``InvalidRequestError`` for arguments past the spec."""
    check_search_params("search", params, page=True)
    queries = _opt(params.get("queries"), _normalize_queries)
    incognito = params.get("incognito")
    page, page_size = params.get("page"), params.get("page_size")
    if incognito is not None and not isinstance(incognito, bool):
        raise InvalidRequestError(f"incognito must be a bool or None, got {incognito!r}")
    pagination = None
    if page is not None or page_size is not None:
        pagination = models.Pagination(
            page=_opt(page, lambda v: check_number("page", v, minimum=0)),
            page_size=_opt(page_size, lambda v: check_number("page_size", v, minimum=1)),
        )
    body = models.SearchRequest(
        **_check_query_fields("", {"text": text, **params}),
        queries=queries,
        incognito=incognito,
        pagination=pagination,
        sort=_opt(params.get("sort"), _normalize_sort),
    )
    try:
        encoded = msgspec.json.encode(body)
    except UnicodeEncodeError as exc:
        raise _not_utf8("the search request", exc) from None
    return Request("POST", "/v2/search", encoded, _parse_search_page, "search", incognito is True)


def without_embeddings(request: Request[models.SearchPage]) -> Request[models.SearchPage]:
    """The same search, its hits' embeddings dropped once parsed (``hit.embeddings`` is None)."""
    # replace() keeps every other field, whatever fields Request gains.
    return msgspec.structs.replace(request, parse=_parse_search_page_without_embeddings)


def _not_utf8(name: str, exc: UnicodeEncodeError) -> InvalidRequestError:
    bad = exc.object[exc.start : exc.end]
    return InvalidRequestError(f"{name} holds {bad!r}, which UTF-8 cannot encode ({exc.reason})")


def get_extraction(
    job_id: str | uuid.UUID, *, format: models.ExtractionFormat | None = None
) -> Request[models.ExtractionJob]:
    """Build ``GET /v2/extract/{jobId}``; ``format`` is "json" or "markdown"."""
    job = validate_id("job_id", job_id)
    target = f"/v2/extract/{job}"  # a validated UUID: nothing to percent-encode
    if check_extraction_format(format) is not None:
        target += f"?format={format}"
    return Request("GET", target, None, partial(decode_body, _extraction_job_decoder), "extract")


def check_extraction_format(format: object) -> models.ExtractionFormat | None:
    """Return ``format`` if it is "json", "markdown" or None; else raise ``InvalidRequestError``."""
    return _check_choice("format", format, _EXTRACTION_FORMATS)


def _check_choice(name: str, value: object, choices: tuple[T, ...]) -> T | None:
    if value is not None and value not in choices:
        raise InvalidRequestError(
            f"{name} must be one of {', '.join(map(str, choices))} or None, got {value!r}"
        )
    return value


def link_preview(url: str, *, type: models.LinkType | None = None) -> Request[models.LinkPreview]:
    """Build ``GET /v2/link``; the URL is sent unchanged, percent-encoded as a query value."""
    if not isinstance(url, str):
        raise _must_be("url", "a string", url)
    if not url:
        raise InvalidRequestError("url must not be empty")
    try:
        target = f"/v2/link?url={quote(url, safe='')}"
    except UnicodeEncodeError as exc:
        raise _not_utf8("url", exc) from None
    if _check_choice("type", type, _LINK_TYPES) is not None:
        target += f"&type={type}"
    return Request("GET", target, None, partial(decode_body, _link_preview_decoder), "link")


def list_webhook_logs(job_id: str | uuid.UUID) -> Request[list[models.WebhookLogSummary]]:
    """Build ``GET /v2/extract/{jobId}/webhook-logs``."""
    job = validate_id("job_id", job_id)  # a validated UUID: nothing to percent-encode
    return Request(
        "GET", f"/v2/extract/{job}/webhook-logs", None, _parse_webhook_log_list, "webhook_logs"
    )


def get_webhook_log(job_id: str | uuid.UUID, log_id: str | uuid.UUID) -> Request[models.WebhookLog]:
    """Build ``GET /v2/extract/{jobId}/webhook-logs/{logId}``."""
    job, log = validate_id("job_id", job_id), validate_id("log_id", log_id)
    parse = partial(decode_body, _webhook_log_decoder)
    return Request("GET", f"/v2/extract/{job}/webhook-logs/{log}", None, parse, "webhook_log")


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

# File signatures (a "." is any byte): the images', then those of common files that are not
# images, named in the error when one is given.
_SIGNATURES = (
    (rb"\x89PNG\r\n\x1a\n", "image/png"),
    (rb"\xff\xd8\xff", "image/jpeg"),
    (rb"GIF8[79]a", "image/gif"),
    (rb"BM", "image/bmp"),
    (rb"II\*\x00|MM\x00\*", "image/tiff"),
    (rb"\x00\x00\x01\x00", "image/x-icon"),
    (rb"RIFF....WEBP", "image/webp"),
    (rb"....ftypavi[fs]", "image/avif"),
    (rb"....ftypheic", "image/heic"),
    (rb"%PDF-", "application/pdf"),
    (rb"PK\x03\x04", "application/zip"),
    (rb"\x1f\x8b", "application/gzip"),
    (rb"\x7fELF", "application/x-executable"),
)


def image_data_url(source: bytes | str | os.PathLike[str], *, mime: str | None = None) -> str:
    """Turn image bytes or a file path into the base64 data URL that ``search(image=...)`` takes.

    Args:
        source: The image's bytes, or the path of its file (read synchronously).
        mime: The image's type (``image/...``); not given: from the bytes' signature (PNG,
            JPEG, GIF, WebP, BMP, TIFF, ICO, AVIF, HEIC), else from the file name's extension.

    Returns:
        ``data:<type>;base64,...``.

    Raises:
        InvalidRequestError: The data is not an image (``mime`` not ``image/...``, a known
            non-image signature such as PDF or ZIP, an extension of another type such as
            ``.txt``), its type cannot be told, or the data URL would be longer than the
            service's limit of 600,000 characters.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        filename = None
    elif isinstance(source, str | os.PathLike):
        filename = os.fspath(source)
        try:
            with open(filename, "rb") as handle:
                data = handle.read(MAX_IMAGE_LENGTH + 1)
        except OSError as exc:
            raise InvalidRequestError(f"cannot read image file {filename!r}: {exc}") from exc
    else:
        raise _must_be("source", "bytes or a file path", source)
    if not data:
        raise InvalidRequestError("the image is empty")
    if mime is None:
        mime = _sniff_mime(data, filename)
    if not (re.fullmatch(r"[\w.+-]+/[\w.+-]+", mime) and mime.lower().startswith("image/")):
        raise InvalidRequestError(
            f"mime must look like 'image/png': an image type (image/...), got {mime!r}"
        )
    prefix = f"data:{mime};base64,"
    length = len(prefix) + 4 * math.ceil(len(data) / 3)
    if length > MAX_IMAGE_LENGTH:
        raise InvalidRequestError(
            f"the image's data URL would be {length} characters long; the limit is "
            f"{MAX_IMAGE_LENGTH} (about {MAX_IMAGE_LENGTH * 3 // 4 // 1024} KiB of image data)"
        )
    return prefix + base64.b64encode(data).decode("ascii")


def _sniff_mime(data: bytes, filename: str | None) -> str:
    what = repr(filename) if filename is not None else "the data"
    mime = next((mime for magic, mime in _SIGNATURES if re.match(magic, data, re.DOTALL)), None)
    told_by = "its content is"
    if mime is None and filename is not None:
        mime, told_by = mimetypes.guess_type(filename)[0], "its extension says"
    if mime is None:
        raise InvalidRequestError(
            f"cannot tell whether {what} is an image (no known image signature); "
            "pass mime='image/...'"
        )
    if not mime.startswith("image/"):
        raise InvalidRequestError(
            f"{what} is not an image: {told_by} {mime}; pass mime='image/...' if it really is one"
        )
    return mime


# ---------------------------------------------------------------------------------------------
# Headers, URLs and redirects
# ---------------------------------------------------------------------------------------------

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _is_loopback(host: str) -> bool:
    # ``host`` is a urlsplit() hostname: lowercase, without an IPv6 address's brackets.
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: What a URL path may hold as it is (RFC 3986 ``pchar`` and ``/``, besides letters and digits),
#: and ``%``: the ``%XX`` escapes already there are kept, so that encoding an encoded path
#: changes nothing; a ``%`` that starts no escape is made ``%25`` first.
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def check_base_url(base_url: object, *, allow_http: bool) -> str:
    """Return the base URL without a trailing slash, or raise ``ConfigurationError``.

    It must be absolute, without user info, query or fragment; a plain ``http`` URL is refused
    unless the host is loopback or ``allow_http`` is set. The host must be ASCII (an
    internationalised name in its ``xn--`` form); in the path, characters a URL cannot hold as
    they are (a space, non-ASCII) are percent-encoded.
    """
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigurationError("base_url is missing: pass base_url= or set ASYNCSEARCH_BASE_URL")
    try:
        parts = urlsplit(base_url.strip())
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigurationError(f"base_url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigurationError(
            "base_url must be an absolute http(s) URL such as https://api.example.com, "
            f"got {_strip_userinfo(base_url)!r}"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError("base_url must not carry user info; pass api_key= instead")
    if parts.query or parts.fragment:
        raise ConfigurationError("base_url must not have a query or fragment")
    if not parts.netloc.isascii() or any(c.isspace() or not c.isprintable() for c in parts.netloc):
        raise ConfigurationError(
            f"base_url's host {parts.netloc!r} must be plain ASCII without spaces; write an "
            "internationalised domain name in its IDNA form (xn--...)"
        )
    try:
        # Percent-encoded as UTF-8: whatever a URL path cannot hold as it is.
        path = quote(_STRAY_PERCENT.sub("%25", parts.path.rstrip("/")), safe=_PATH_SAFE)
    except UnicodeEncodeError:
        raise ConfigurationError("base_url's path is not valid Unicode: a lone surrogate") from None
    # Over plain http to another host, the key would cross the network in the clear.
    if parts.scheme == "http" and not allow_http and not _is_loopback(host):
        raise ConfigurationError(
            f"base_url {base_url!r} is plain http to a host that is not loopback; the API key "
            "would travel unencrypted. Use https, or pass allow_http=True if you mean it"
        )
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _strip_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if "@" in parts.netloc:
        url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return url


#: Headers the client sets from its own options, which extra headers cannot replace.
PROTECTED_HEADERS = frozenset({"x-api-key", "x-service-base-id"})
#: Headers that frame, route or describe the message the SDK builds (RFC 9110 and RFC 9112:
#: the hop-by-hop ones, the body's length, encoding and type, the target host). Set by hand they
#: would contradict what is sent: two lengths (the request-smuggling shape), a body cut short, a
#: body declared compressed that is not. aiohttp sets them from the request itself.
MESSAGE_HEADERS = frozenset(
    {
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "expect",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
#: Why each of those may not be set: the error's reason.
_REFUSED_HEADERS = {
    **dict.fromkeys(PROTECTED_HEADERS, "it comes from api_key or base_id (see with_options)"),
    **dict.fromkeys(MESSAGE_HEADERS, "it frames or routes the message, which the client builds"),
}
# RFC 9110 5.1: a field name is a token (visible ASCII but delimiters); 5.5: a value holds no
# CR, LF or NUL (other controls are obsolete but allowed, and aiohttp sends them as they are).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")


def check_extra_headers(
    headers: object, *, name: str, error: type[_errors.AsyncSearchError]
) -> dict[str, str]:
    """Return ``headers`` as a dict, or raise ``error`` for a bad or protected name or value.

    Refused: a name that is not an RFC 9110 token (``"X-Api-Key "`` with its space included), a
    value with CR, LF or NUL, two names that differ only in case, the key and the base
    (``PROTECTED_HEADERS``), and the headers of the message's framing (``MESSAGE_HEADERS``).
    """
    if not isinstance(headers, Mapping):
        raise error(f"{name} must be a mapping of header names to values")
    seen: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not _TOKEN.fullmatch(key):
            raise error(
                f"{name}: {key!r} is not a header name (RFC 9110: letters, digits and "
                "!#$%&'*+-.^_`|~ only, no spaces)"
            )
        lower = key.lower()
        if lower in _REFUSED_HEADERS:
            raise error(f"{name} cannot set {key}: {_REFUSED_HEADERS[lower]}")
        if lower in seen:
            raise error(f"{name} names one header twice: {seen[lower]!r} and {key!r}")
        seen[lower] = key
        if not isinstance(value, str) or _BAD_VALUE.search(value):
            raise error(
                f"{name}: header {key!r} must be a string without line breaks (CR, LF) or NUL"
            )
    return dict(headers)


def encode_extra_query(query: object) -> tuple[tuple[str, str], ...]:
    """``extra_query`` as percent-encoded (name, value) pairs; ``InvalidRequestError`` if bad."""
    if not isinstance(query, Mapping):
        raise InvalidRequestError("extra_query must be a mapping of names to values")
    pairs = []
    for key, value in query.items():
        if not isinstance(key, str) or not key:
            raise InvalidRequestError(f"extra_query: {key!r} is not a parameter name")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, str | int | float):
            raise _must_be(f"extra_query: {key!r}", "a str, int, float or bool", value)
        try:
            pairs.append((quote(key, safe=""), quote(str(value), safe="")))
        except UnicodeEncodeError as exc:
            raise _not_utf8(f"extra_query {key!r}", exc) from None
    return tuple(pairs)


def check_extra_body(body: object) -> dict[str, Any]:
    """``extra_body`` as a dict that encodes as JSON; ``InvalidRequestError`` if it cannot."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("extra_body must be a mapping of field names to values")
    for key in body:
        if not isinstance(key, str):
            raise InvalidRequestError(f"extra_body: {key!r} is not a field name")
    try:
        msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequestError(f"extra_body cannot be sent as JSON: {exc}") from None
    return dict(body)


def with_extras(
    request: Request[T],
    *,
    query: tuple[tuple[str, str], ...] = (),
    body: Mapping[str, Any] | None = None,
) -> Request[T]:
    """The request with ``query`` (``encode_extra_query``) added to its URL and ``body``
    (``check_extra_body``) merged into its JSON body; what the request had of a name is replaced.
    """
    target, new_body = request.target, request.body
    if query:
        path, _, current = target.partition("?")
        names = {name for name, _ in query}
        kept = [pair for pair in current.split("&") if pair and pair.partition("=")[0] not in names]
        target = path + "?" + "&".join(kept + [f"{name}={value}" for name, value in query])
    idempotent = request.idempotent
    if body:
        if request.body is None:
            raise InvalidRequestError(f"extra_body: {request.method} {request.path} has no body")
        merged = msgspec.json.decode(request.body)
        merged.update(body)
        if request.endpoint == "search":
            # Decided from the body as sent: the same checks as the arguments, and the retry
            # rule read from the merged ``incognito``, not from the argument it replaced.
            idempotent = check_search_body(merged)
        new_body = msgspec.json.encode(merged)
    return msgspec.structs.replace(request, target=target, body=new_body, idempotent=idempotent)


def check_search_body(body: Mapping[str, Any]) -> bool:
    """Check a search body (wire names) as ``search`` checks its arguments; True if incognito.

    For a body that ``extra_body`` changed: what it sets of the known fields must pass the
    checks an argument would (text length, precision, ``pagination.pageSize`` >= 1, ...).
    Raises ``InvalidRequestError`` naming ``extra_body``.
    """
    # The fields ``search`` has arguments for, with pagination's in place of ``pagination``.
    params = _known_fields(body, models.SearchRequest)
    pagination = params.pop("pagination", None)
    try:
        if pagination is not None:
            if not isinstance(pagination, Mapping):
                raise InvalidRequestError(f"pagination must be an object, got {pagination!r}")
            params.update(_known_fields(pagination, models.Pagination))
        # Idempotent when the body's ``incognito`` is true.
        return search(**params).idempotent
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"extra_body makes the search invalid: {exc.message}") from None


def request_id(headers: Mapping[str, str]) -> str | None:
    """The id the service gave an answer (``X-Request-Id``, else ``Request-Id``), or ``None``."""
    value = _header(headers, "x-request-id")
    return value if value is not None else _header(headers, "request-id")


def build_headers(
    *,
    api_key: str,
    base_id: str | None,
    user_agent: str,
    extra: Mapping[str, str] | None,
    has_body: bool,
) -> Mapping[str, str]:
    """Headers of one request; the caller's ``extra`` never overrides auth or base selection.

    Made once per client (``Options``), for every request: a ``CIMultiDictProxy``, which aiohttp
    takes as it is where it would copy a dict into one first (measured: 8k fewer instructions of
    ~610k a bulk request).
    """
    headers: dict[str, str] = {
        "Accept": "application/json",
        # The transport inflates these itself, in bounded steps (see max_response_bytes).
        "Accept-Encoding": "gzip, deflate",
        "User-Agent": user_agent,
    }
    for key, value in (extra or {}).items():
        lower = key.lower()
        if lower not in PROTECTED_HEADERS:  # refused earlier, by check_extra_headers
            # One name once: an extra header replaces the default of the same name in any case.
            headers = {name: item for name, item in headers.items() if name.lower() != lower}
            headers[key] = value
    if has_body:
        headers["Content-Type"] = "application/json"
    headers["X-Api-Key"] = api_key
    if base_id is not None:
        headers["X-Service-Base-Id"] = base_id
    return CIMultiDictProxy(CIMultiDict(headers))


def _origin(url: str) -> tuple[str, str, int | None]:
    # urlsplit() lowercases the scheme and the hostname.
    parts = urlsplit(url)
    port = parts.port if parts.port is not None else {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.scheme, parts.hostname or "", port)


def redirect_target(current_url: str, location: str) -> str | None:
    """The absolute URL to follow a redirect to, or ``None`` when it must not be followed.

    Only same-origin redirects are followed; a ``Location`` with user info is never followed.
    """
    try:
        target = urljoin(current_url, location.strip())
        parts = urlsplit(target)
        # Same origin (scheme, host and port) only, so that ``X-Api-Key`` never goes elsewhere.
        same_origin = _origin(current_url) == _origin(target)
    except ValueError:
        return None
    if parts.username is not None or "@" in parts.netloc or not same_origin:
        return None
    return urlunsplit(parts._replace(fragment=""))


# ---------------------------------------------------------------------------------------------
# Secrets: scrubbed from whatever leaves the client
# ---------------------------------------------------------------------------------------------

REDACTED = "[redacted]"
#: Request headers whose value is a credential: scrubbed by name wherever such a header shows,
#: whoever set it (a proxy of ``trust_env`` or of a caller's session, which the client never
#: sees, sends its credentials in ``Proxy-Authorization`` too).
SECRET_HEADERS = frozenset({"x-api-key", "proxy-authorization"})
# Such a header quoted in a text: a repr of a dict of headers, a raw header block.
_HEADER_IN_TEXT = re.compile(
    r"((?:x-api-key|proxy-authorization)['\"]?\s*[:=,]\s*['\"]?)(?!\[redacted\])[^'\"\r\n,;})\]]+",
    re.IGNORECASE,
)


class Secrets:
    """The credentials a call sends, in every form they take, as one set to scrub.

    The API key, and a proxy's credentials (its password, ``user:password`` raw and
    percent-encoded, their base64, the ``Proxy-Authorization`` value); on top of those, the value
    of any ``X-Api-Key`` or ``Proxy-Authorization`` header, by name. ``scrub`` is the one place
    they are taken out of an error on its way to the caller.
    """

    def __init__(self, texts: Collection[str] = ()) -> None:
        # Longest first, so that "user:password" goes before the password alone.
        self.texts = tuple(sorted({text for text in texts if text}, key=len, reverse=True))

    def redact(self, text: str) -> str:
        """``text`` with every secret, and every credential header's value, replaced."""
        for secret in self.texts:
            text = text.replace(secret, REDACTED)
        # The names' regex takes ~1.8 µs even on a short text that holds neither (a request id,
        # read for every answer of a bulk call), a test of the lowered text 0.1 µs: every text it
        # matches holds "key" or "author" once lowered (its IGNORECASE takes more than lower()
        # gives back for "i" alone: U+0130 and U+0131).
        lowered = text.lower()
        if "key" in lowered or "author" in lowered:
            text = _HEADER_IN_TEXT.sub(r"\1" + REDACTED, text)
        return text

    def scrubbed(self, value: Any, *, shown: bool = True, depth: int = 0) -> Any:
        """``value`` if it shows no secret, else a scrubbed copy of the same type.

        ``str``, ``bytes``, ``bytearray``, ``dict`` (a credential header's value replaced by
        name; another mapping becomes a ``dict``, aiohttp's headers stay a ``CIMultiDictProxy``),
        ``list``, ``tuple`` (a named one too) and ``set`` are copied as they are (a subclass as
        its plain type); another object whose ``repr`` shows a secret becomes that scrubbed
        ``repr`` (only when ``shown``: an exception's arguments, which its text shows). Nothing
        is changed in place.
        """
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, bytes | bytearray):  # as UTF-8, any other byte kept as it was
            text = value.decode("utf-8", "surrogateescape")
            clean = self.redact(text)
            return value if clean == text else type(value)(clean.encode("utf-8", "surrogateescape"))
        if value is None or isinstance(value, bool | int | float | BaseException) or depth > 8:
            return value  # nothing to show a secret, or walked on its own (an exception)
        deeper: dict[str, Any] = {"shown": shown, "depth": depth + 1}
        if isinstance(value, Mapping):
            keys, old = list(value.keys()), list(value.values())
            new = [
                REDACTED if str(k).lower() in SECRET_HEADERS else self.scrubbed(v, **deeper)
                for k, v in zip(keys, old, strict=True)
            ]
            parts: list[Any] = list(zip(keys, new, strict=True))
        elif isinstance(value, list | tuple | set | frozenset):
            old = list(value)
            new = parts = [self.scrubbed(item, **deeper) for item in old]
        else:  # another object: its repr, where its text shows (an argument, a note)
            shows = repr(value) if shown else ""
            return value if (clean := self.redact(shows)) == shows else clean
        if all(after is before for after, before in zip(new, old, strict=True)):
            return value
        if isinstance(value, CIMultiDictProxy):
            return CIMultiDictProxy(CIMultiDict(parts))
        if hasattr(value, "_make"):  # a named tuple (aiohttp's RequestInfo)
            return value._make(parts)
        # Of its own type if a plain one (a dict, a list, ...), else of the plain one it is.
        return (dict if isinstance(value, Mapping) else type(value).__mro__[-2])(parts)

    def scrub(self, error: BaseException) -> None:
        """Take the secrets out of ``error`` and all it leads to: its arguments, notes and
        attributes (``message``, ``headers``, ``request_info``, ``body``, ...), its cause, its
        context and a group's members. The error stays the same object; what it holds that shows
        a secret is replaced by a scrubbed copy, so that no object of the caller's is changed."""
        seen: set[int] = set()
        todo: list[BaseException | None] = [error]
        while todo:
            exc = todo.pop()
            if exc is None or id(exc) in seen:
                continue
            seen.add(id(exc))
            exc.args = self.scrubbed(exc.args)
            for name, value in list(getattr(exc, "__dict__", {}).items()):
                setattr(exc, name, self.scrubbed(value, shown=name == "__notes__"))
            group = exc.exceptions if isinstance(exc, BaseExceptionGroup) else ()
            todo += (exc.__cause__, exc.__context__, *group)


# ---------------------------------------------------------------------------------------------
# Status errors, Retry-After and the retry decision
# ---------------------------------------------------------------------------------------------

_STATUS_ERRORS: dict[int, type[_errors.APIStatusError]] = {
    400: _errors.BadRequestError,
    401: _errors.AuthenticationError,
    403: _errors.PermissionDeniedError,
    404: _errors.NotFoundError,
    409: _errors.ConflictError,
    422: _errors.UnprocessableEntityError,
    429: _errors.RateLimitError,
}
_MAX_ERROR_TEXT = 4096


def _error_body(body: bytes) -> Any:
    if not body:
        return None
    text = body[:_MAX_ERROR_TEXT].decode("utf-8", "replace")
    if len(body) <= _MAX_ERROR_TEXT:
        with suppress(msgspec.DecodeError):
            return msgspec.json.decode(text)
    return text


def _error_detail(body: Any) -> str:
    if isinstance(body, str):
        return " ".join(body.split())[:200]
    for key in ("message", "detail", "error", "title") if isinstance(body, dict) else ():
        value = body.get(key)
        if isinstance(value, dict):
            return _error_detail(value)
        if isinstance(value, str) and value:
            return value[:300]
    return ""


def status_error(
    response: Response,
    *,
    method: str,
    attempts: int | None,
    retry_after: float | None = None,
    reason: str | None = None,
) -> _errors.APIStatusError:
    """The typed error for a response that is not a success (its secrets are scrubbed where it
    leaves the client: ``Secrets.scrub``)."""
    status = response.status
    default = _errors.InternalServerError if status >= 500 else _errors.APIStatusError
    cls = _STATUS_ERRORS.get(status, default)
    body = _error_body(response.body)
    phrase = responses.get(status, "Unknown Status")
    url = _strip_userinfo(response.url)
    message = f"{status} {phrase} from {method} {urlsplit(url).path or '/'}"
    detail = reason or _error_detail(body)
    if detail:
        message += ": " + detail
    error = cls(
        message,
        status_code=status,
        headers=response.headers,
        body=body,
        method=method,
        url=url,
        attempts=attempts,
    )
    if isinstance(error, _errors.RateLimitError):
        error.retry_after = retry_after
    error.request_id = request_id(response.headers)
    return error


def is_retryable_status(
    status: int, *, idempotent: bool = True, statuses: Collection[int] = RETRYABLE_STATUSES
) -> bool:
    """Whether an answer with ``status`` is worth another attempt.

    Only a status in ``statuses`` is; of those, 408, 429 and 503 are retried for every request,
    the others only for an ``idempotent`` one. Every other status is final.
    """
    # Other answers may come after the service acted on it (a 500 after the search was
    # recorded, a 502 or 504 from a gateway whose upstream did the work).
    return status in statuses and (idempotent or status in NOT_ACTED_ON_STATUSES)


def is_retryable_connection_error(
    error: _errors.APIConnectionError, *, idempotent: bool = True
) -> bool:
    """Whether a failed attempt without an answer is worth another one.

    Retried for every request when ``error.request_sent`` is False (DNS, refused, connect
    timeout, TLS handshake), else only for an ``idempotent`` one; never when ``error.retryable``
    is False.
    """
    # After any byte was sent (reset, closed without an answer, read or total timeout, a body cut
    # short), the request may have reached the server.
    return error.retryable and (idempotent or not error.request_sent)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The delay in seconds the server asked for, or ``None`` when it gave none that makes sense.

    Reads ``retry-after-ms`` first, then ``Retry-After`` as seconds or as an HTTP date. Only
    ASCII counts: seconds are ASCII digits with an optional ASCII decimal part (``3``, ``1.5``),
    and a date must be all ASCII. ``None`` (the caller's own backoff) for anything else: a
    negative or signed number, other scripts' digits (``'\u0663'``), ``inf``, ``nan``,
    exponents, a number past the largest float, and an HTTP date that is not in the future.
    """
    millis = _delay_seconds(_header(headers, "retry-after-ms") or "")
    if millis is not None:
        return millis / 1000.0
    raw = (_header(headers, "retry-after") or "").strip()
    seconds = _delay_seconds(raw)
    if seconds is not None:
        return seconds
    if not raw.isascii() or not raw:
        return None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    current = now if now is not None else datetime.datetime.now(datetime.UTC).timestamp()
    delay = when.timestamp() - current
    # A date not in the future: the server's wait is over, or the clocks disagree; either way it
    # asks for no particular delay.
    return delay if delay > 0 else None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and isinstance(headers, dict):
        # Plain dicts are case-sensitive; aiohttp's headers (not a dict) are not, and a header
        # they lack is not worth a scan per answer of a bulk call.
        value = next((item for key, item in headers.items() if key.lower() == name), None)
    return value


# ASCII only: a str pattern's \d would also take other scripts' digits ('\u0663' is 3 to float()).
_DELAY_SECONDS_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _delay_seconds(text: str) -> float | None:
    """A non-negative finite number of ASCII digits (with an optional decimal part), or None."""
    text = text.strip()
    if not _DELAY_SECONDS_RE.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def backoff_delay(
    retry_number: int, *, base: float, cap: float, random: Callable[[], float]
) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(n-1))]."""
    ceiling: float = min(cap, base * 2.0 ** max(retry_number - 1, 0))
    return ceiling * random()
