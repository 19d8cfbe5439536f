"""Validation of request bodies and parameters, field by field, into the search module's types.

Two modes. Both enforce what the spec fixes: the types of the fields, ``null`` only where the
spec allows it (``incognito``, ``filters.createdAfter``, ``filters.createdBefore``), the limits
of ``text``, ``image`` and ``precision``, and the UUID pattern. Where the spec is silent the
lenient mode (the default) answers like a tolerant server: unknown fields are ignored, an
unknown ``sort.field`` or ``sort.order`` falls back to the default order, out-of-range paging is
clamped, a ``queries`` element may be empty and a filter date may be a date alone. The strict
mode refuses all of these with a 422 naming the field, so that a client sending the wrong wire
name or value fails loudly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._embed import decode_data_url
from ._errors import validation_error
from ._search import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_PRECISION,
    MAX_PAGE_SIZE,
    SORT_FIELDS,
    Filters,
    ImageQuery,
    QuerySpec,
    SearchRequest,
    parse_timestamp,
)
from ._store import UUID_RE

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_BODY_DEPTH",
    "MAX_BODY_QUERIES",
    "MAX_FILTER_VALUES",
    "MAX_IMAGE_LENGTH",
    "MAX_TEXT_LENGTH",
    "check_uuid",
    "nests_deeper_than",
    "parse_search",
]

MAX_TEXT_LENGTH = 255
MAX_IMAGE_LENGTH = 600_000

# The largest search body the spec's limits allow. The spec bounds text (255 characters) and
# image (600,000) but no array and no other string, so the emulator assumes bounds for those:
MAX_BODY_QUERIES = 16  # elements of queries, besides the top-level query
MAX_FILTER_VALUES = 100  # values in each filter array
_FREE_STRING_CHARS = 64  # a filter value, a timestamp, sort.field, sort.order
_NUMBER_CHARS = 32  # a precision, a colour, page, pageSize
# Each string counted as json.dumps writes it: ASCII-only ones (the image data URL, a UUID, a
# timestamp) one byte per character, any other one 12 bytes per character (a character outside
# the BMP escaped as a surrogate pair, "\ud83d\ude00"). Compact JSON, no whitespace.
_WIDE_CHAR_BYTES = 12
_STRING_FILTERS = ("kinds", "parentIds", "ancestorIds", "tagIds", "userIds")


def _largest_body_bytes() -> int:
    """Return the length of the largest compact JSON search body under the bounds above."""

    def string(chars: int, *, ascii_only: bool = False) -> int:
        return 2 + chars * (1 if ascii_only else _WIDE_CHAR_BYTES)

    def members(*pairs: tuple[str, int]) -> int:  # {"name":value,...}
        return 2 + sum(len(name) + 3 + value for name, value in pairs) + len(pairs) - 1

    def array(item: int, count: int) -> int:  # [item,...]
        return 2 + item * count + count - 1

    free = string(_FREE_STRING_CHARS)
    filters = members(
        *((name, array(free, MAX_FILTER_VALUES)) for name in _STRING_FILTERS),
        ("color", array(_NUMBER_CHARS, MAX_FILTER_VALUES)),
        ("createdAfter", string(_FREE_STRING_CHARS, ascii_only=True)),
        ("createdBefore", string(_FREE_STRING_CHARS, ascii_only=True)),
    )
    query = (
        ("text", string(MAX_TEXT_LENGTH)),
        ("image", string(MAX_IMAGE_LENGTH, ascii_only=True)),
        ("resourceId", string(36, ascii_only=True)),
        ("precision", _NUMBER_CHARS),
        ("filters", filters),
    )
    return members(
        *query,
        ("queries", array(members(*query), MAX_BODY_QUERIES)),
        ("incognito", len("false")),
        ("pagination", members(("page", _NUMBER_CHARS), ("pageSize", _NUMBER_CHARS))),
        ("sort", members(("field", free), ("order", free))),
    )


#: The emulator's body cap (413 beyond it): 16,869,605 bytes (about 16.1 MiB).
MAX_BODY_BYTES = _largest_body_bytes()

#: The deepest nesting of arrays and objects a body may have (400 beyond it). A search body
#: needs 5 (body, queries, element, filters, kinds); the control endpoints take free-form
#: JSON (``structured``, ``requestPayload``), so the cap is serde_json's default, well below
#: the depth at which decoding, copying or encoding a value would exhaust Python's stack.
MAX_BODY_DEPTH = 128


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Return True when decoded JSON nests arrays and objects more than ``limit`` levels deep.

    Walks level by level, not by recursion, so that any depth the decoder allowed is measured
    without exhausting Python's stack.
    """
    # Exact types (JSON decodes to dict and list, never subclasses) in a plain loop: a body at
    # the size cap may hold millions of small arrays, and this keeps the walk quicker than
    # decoding them was.
    level: list[Any] = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                if type(child) is dict or type(child) is list:
                    below.append(child)
        level = below
    return False


_TOP_FIELDS = frozenset(
    {
        "text",
        "image",
        "resourceId",
        "filters",
        "precision",
        "queries",
        "incognito",
        "pagination",
        "sort",
    }
)
# A date, then a time (seconds, fraction and offset optional; naive means UTC).
_DATE_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}", re.ASCII)
_ELEMENT_FIELDS = frozenset({"text", "image", "resourceId", "filters", "precision"})
_FILTER_FIELDS = frozenset(
    {
        "kinds",
        "color",
        "parentIds",
        "ancestorIds",
        "tagIds",
        "userIds",
        "createdAfter",
        "createdBefore",
    }
)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _object(value: Any, where: str, allowed: frozenset[str], strict: bool) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise validation_error(
            f"{where or 'the body'} must be an object, not {_type_name(value)}", where or None
        )
    unknown = sorted(set(value) - allowed)
    if unknown and strict:
        prefix = f"{where}." if where else ""
        raise validation_error(f"unknown field {prefix}{unknown[0]}", f"{prefix}{unknown[0]}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise validation_error(f"{where} must be a string, not {_type_name(value)}", where)
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise validation_error(f"{where} must be a number, not {_type_name(value)}", where)
    return float(value)


def _integer(value: Any, where: str, strict: bool = True) -> int:
    # JSON Schema's "integer" includes 1.0; only the strict mode insists on the integer form.
    if not strict and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error(f"{where} must be an integer, not {_type_name(value)}", where)
    return value


def check_uuid(value: Any, where: str) -> str:
    """Return ``value`` when it matches the spec's UUID pattern; else raise a 422."""
    text = _string(value, where)
    # fullmatch, not match: the pattern's "$" would let a trailing newline through.
    if not UUID_RE.fullmatch(text):
        raise validation_error(f"{where} must be a UUID (lower-case, version 1-8)", where)
    return text


def _string_set(value: Any, where: str) -> frozenset[str] | None:
    if not isinstance(value, list):
        raise validation_error(f"{where} must be an array, not {_type_name(value)}", where)
    return frozenset(_string(item, f"{where}[{i}]") for i, item in enumerate(value)) or None


def _integer_set(value: Any, where: str, strict: bool) -> frozenset[int] | None:
    if not isinstance(value, list):
        raise validation_error(f"{where} must be an array, not {_type_name(value)}", where)
    items = (_integer(item, f"{where}[{i}]", strict) for i, item in enumerate(value))
    return frozenset(items) or None


def _timestamp(value: Any, where: str, strict: bool) -> float | None:
    if value is None:
        return None
    text = _string(value, where)
    if strict and not _DATE_TIME_RE.match(text):
        raise validation_error(f"{where} must be an ISO 8601 timestamp with a time", where)
    try:
        return parse_timestamp(text)
    except ValueError:
        raise validation_error(f"{where} must be an ISO 8601 timestamp", where) from None


def _filters(value: Any, where: str, strict: bool) -> Filters:
    data = _object(value, where, _FILTER_FIELDS, strict)

    def sub(name: str) -> str:
        return f"{where}.{name}"

    strings: dict[str, frozenset[str] | None] = {}
    for wire, attr in (
        ("kinds", "kinds"),
        ("parentIds", "parent_ids"),
        ("ancestorIds", "ancestor_ids"),
        ("tagIds", "tag_ids"),
        ("userIds", "user_ids"),
    ):
        strings[attr] = _string_set(data[wire], sub(wire)) if wire in data else None
    return Filters(
        color=_integer_set(data["color"], sub("color"), strict) if "color" in data else None,
        created_after=_timestamp(data.get("createdAfter"), sub("createdAfter"), strict),
        created_before=_timestamp(data.get("createdBefore"), sub("createdBefore"), strict),
        **strings,
    )


def _precision(value: Any, where: str) -> float:
    number = _number(value, where)
    if not 0.0 <= number <= 1.0:
        raise validation_error(f"{where} must be between 0 and 1 inclusive", where)
    return number


def _element(
    data: Mapping[str, Any], prefix: str, default_precision: float, strict: bool
) -> QuerySpec:
    def sub(name: str) -> str:
        return f"{prefix}{name}"

    text = image = resource_id = None
    if "text" in data:
        text = _string(data["text"], sub("text"))
        if len(text) > MAX_TEXT_LENGTH:
            raise validation_error(
                f"{sub('text')} must be at most {MAX_TEXT_LENGTH} characters", sub("text")
            )
    if "image" in data:
        image_url = _string(data["image"], sub("image"))
        if len(image_url) > MAX_IMAGE_LENGTH:
            raise validation_error(
                f"{sub('image')} must be at most {MAX_IMAGE_LENGTH} characters", sub("image")
            )
        try:
            # The spec says "base64" and no more: padding is optional unless strict.
            image = ImageQuery(decode_data_url(image_url, require_padding=strict))
        except ValueError as exc:
            raise validation_error(f"{sub('image')}: {exc}", sub("image")) from None
    if "resourceId" in data:
        resource_id = check_uuid(data["resourceId"], sub("resourceId"))
    filters = _filters(data["filters"], sub("filters"), strict) if "filters" in data else Filters()
    precision = (
        _precision(data["precision"], sub("precision"))
        if "precision" in data
        else default_precision
    )
    return QuerySpec(
        text=text, image=image, resource_id=resource_id, filters=filters, precision=precision
    )


def parse_search(body: Any, *, first_page: int = 1, strict: bool = False) -> SearchRequest:
    """Return the validated search request of a decoded JSON body; raise a 422 on any fault.

    ``strict`` also refuses what the spec leaves open (see the module docstring).
    """
    data = _object(body, "", _TOP_FIELDS, strict)
    precision = (
        _precision(data["precision"], "precision") if "precision" in data else DEFAULT_PRECISION
    )
    top = _element(
        {k: v for k, v in data.items() if k in ("text", "image", "resourceId", "precision")},
        "",
        precision,
        strict,
    )
    filters = _filters(data["filters"], "filters", strict) if "filters" in data else Filters()

    elements: list[QuerySpec] = []
    queries = data.get("queries", [])
    if not isinstance(queries, list):
        raise validation_error(f"queries must be an array, not {_type_name(queries)}", "queries")
    for i, item in enumerate(queries):
        where = f"queries[{i}]"
        element = _object(item, where, _ELEMENT_FIELDS, strict)
        if strict and not element:
            raise validation_error(
                f"{where} must have at least one of {', '.join(sorted(_ELEMENT_FIELDS))}", where
            )
        elements.append(_element(element, f"{where}.", precision, strict))
    has_signal = top.text is not None or top.image is not None or top.resource_id is not None
    if has_signal or not elements:
        elements.insert(0, top)

    incognito = data.get("incognito")
    if incognito is not None and not isinstance(incognito, bool):
        raise validation_error(
            f"incognito must be a boolean or null, not {_type_name(incognito)}", "incognito"
        )

    page, page_size = _pagination(data, first_page, strict)
    sort_field, sort_order = _sort(data, strict)
    return SearchRequest(
        elements=tuple(elements),
        filters=filters,
        page_index=page - first_page,
        page_size=page_size,
        sort_field=sort_field,
        sort_order=sort_order,
        incognito=incognito,
    )


def _pagination(data: Mapping[str, Any], first_page: int, strict: bool) -> tuple[int, int]:
    """Return (page, pageSize); out of range is a 422 when strict, else clamped into range."""
    page, page_size = first_page, DEFAULT_PAGE_SIZE
    if "pagination" not in data:
        return page, page_size
    paging = _object(data["pagination"], "pagination", frozenset({"page", "pageSize"}), strict)
    if "page" in paging:
        page = _integer(paging["page"], "pagination.page", strict)
        if page < first_page:
            if strict:
                raise validation_error(
                    f"pagination.page must be at least {first_page}", "pagination.page"
                )
            page = first_page
    if "pageSize" in paging:
        page_size = _integer(paging["pageSize"], "pagination.pageSize", strict)
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            if strict:
                raise validation_error(
                    f"pagination.pageSize must be between 1 and {MAX_PAGE_SIZE}",
                    "pagination.pageSize",
                )
            page_size = min(max(page_size, 1), MAX_PAGE_SIZE)
    return page, page_size


def _sort(data: Mapping[str, Any], strict: bool) -> tuple[str, str]:
    """Return (field, order), "" for the default; an unknown value is a 422 when strict."""
    sort_field, sort_order = "", ""
    if "sort" not in data:
        return sort_field, sort_order
    sort = _object(data["sort"], "sort", frozenset({"field", "order"}), strict)
    if "field" in sort:
        sort_field = _string(sort["field"], "sort.field")
        if sort_field not in SORT_FIELDS:
            if strict:
                raise validation_error(
                    f"sort.field must be one of {', '.join(SORT_FIELDS)}", "sort.field"
                )
            sort_field = ""  # the default order: relevance (newest first when browsing)
    if "order" in sort:
        sort_order = _string(sort["order"], "sort.order")
        if sort_order not in ("asc", "desc"):
            if strict:
                raise validation_error("sort.order must be asc or desc", "sort.order")
            sort_order = ""  # the field's default order
    return sort_field, sort_order
