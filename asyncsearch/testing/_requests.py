"""Validation of request bodies and parameters, field by field, into the search module's types.

Strict on purpose, so that a client sending the wrong wire name or type fails loudly: unknown
fields are refused, ``null`` is accepted only where the spec allows it (``incognito``,
``filters.createdAfter``, ``filters.createdBefore``), and every limit of the spec is enforced.
"""

from __future__ import annotations

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
    QuerySpec,
    SearchRequest,
    parse_timestamp,
)
from ._store import UUID_RE

__all__ = [
    "MAX_IMAGE_LENGTH",
    "MAX_TEXT_LENGTH",
    "check_uuid",
    "parse_search",
]

MAX_TEXT_LENGTH = 255
MAX_IMAGE_LENGTH = 600_000

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


def _object(value: Any, where: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise validation_error(
            f"{where or 'the body'} must be an object, not {_type_name(value)}", where or None
        )
    unknown = sorted(set(value) - allowed)
    if unknown:
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


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error(f"{where} must be an integer, not {_type_name(value)}", where)
    return value


def check_uuid(value: Any, where: str) -> str:
    """Return ``value`` when it matches the spec's UUID pattern; else raise a 422."""
    text = _string(value, where)
    if not UUID_RE.match(text):
        raise validation_error(f"{where} must be a UUID (lower-case, version 1-8)", where)
    return text


def _string_set(value: Any, where: str) -> frozenset[str] | None:
    if not isinstance(value, list):
        raise validation_error(f"{where} must be an array, not {_type_name(value)}", where)
    return frozenset(_string(item, f"{where}[{i}]") for i, item in enumerate(value)) or None


def _integer_set(value: Any, where: str) -> frozenset[int] | None:
    if not isinstance(value, list):
        raise validation_error(f"{where} must be an array, not {_type_name(value)}", where)
    return frozenset(_integer(item, f"{where}[{i}]") for i, item in enumerate(value)) or None


def _timestamp(value: Any, where: str) -> float | None:
    if value is None:
        return None
    text = _string(value, where)
    try:
        return parse_timestamp(text)
    except ValueError:
        raise validation_error(f"{where} must be an ISO 8601 timestamp", where) from None


def _filters(value: Any, where: str) -> Filters:
    data = _object(value, where, _FILTER_FIELDS)

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
        color=_integer_set(data["color"], sub("color")) if "color" in data else None,
        created_after=_timestamp(data.get("createdAfter"), sub("createdAfter")),
        created_before=_timestamp(data.get("createdBefore"), sub("createdBefore")),
        **strings,
    )


def _precision(value: Any, where: str) -> float:
    number = _number(value, where)
    if not 0.0 <= number <= 1.0:
        raise validation_error(f"{where} must be between 0 and 1 inclusive", where)
    return number


def _element(data: Mapping[str, Any], prefix: str, default_precision: float) -> QuerySpec:
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
            image = decode_data_url(image_url)
        except ValueError as exc:
            raise validation_error(f"{sub('image')}: {exc}", sub("image")) from None
    if "resourceId" in data:
        resource_id = check_uuid(data["resourceId"], sub("resourceId"))
    filters = _filters(data["filters"], sub("filters")) if "filters" in data else Filters()
    precision = (
        _precision(data["precision"], sub("precision"))
        if "precision" in data
        else default_precision
    )
    return QuerySpec(
        text=text, image=image, resource_id=resource_id, filters=filters, precision=precision
    )


def parse_search(body: Any, *, first_page: int = 1) -> SearchRequest:
    """Return the validated search request of a decoded JSON body; raise a 422 on any fault."""
    data = _object(body, "", _TOP_FIELDS)
    precision = (
        _precision(data["precision"], "precision") if "precision" in data else DEFAULT_PRECISION
    )
    top = _element(
        {k: v for k, v in data.items() if k in ("text", "image", "resourceId", "precision")},
        "",
        precision,
    )
    filters = _filters(data["filters"], "filters") if "filters" in data else Filters()

    elements: list[QuerySpec] = []
    queries = data.get("queries", [])
    if not isinstance(queries, list):
        raise validation_error(f"queries must be an array, not {_type_name(queries)}", "queries")
    for i, item in enumerate(queries):
        where = f"queries[{i}]"
        elements.append(_element(_object(item, where, _ELEMENT_FIELDS), f"{where}.", precision))
    has_signal = top.text is not None or top.image is not None or top.resource_id is not None
    if has_signal or not elements:
        elements.insert(0, top)

    incognito = data.get("incognito")
    if incognito is not None and not isinstance(incognito, bool):
        raise validation_error(
            f"incognito must be a boolean or null, not {_type_name(incognito)}", "incognito"
        )

    page, page_size = first_page, DEFAULT_PAGE_SIZE
    if "pagination" in data:
        paging = _object(data["pagination"], "pagination", frozenset({"page", "pageSize"}))
        if "page" in paging:
            page = _integer(paging["page"], "pagination.page")
            if page < first_page:
                raise validation_error(
                    f"pagination.page must be at least {first_page}", "pagination.page"
                )
        if "pageSize" in paging:
            page_size = _integer(paging["pageSize"], "pagination.pageSize")
            if not 1 <= page_size <= MAX_PAGE_SIZE:
                raise validation_error(
                    f"pagination.pageSize must be between 1 and {MAX_PAGE_SIZE}",
                    "pagination.pageSize",
                )

    sort_field, sort_order = "", ""
    if "sort" in data:
        sort = _object(data["sort"], "sort", frozenset({"field", "order"}))
        if "field" in sort:
            sort_field = _string(sort["field"], "sort.field")
            if sort_field not in SORT_FIELDS:
                raise validation_error(
                    f"sort.field must be one of {', '.join(SORT_FIELDS)}", "sort.field"
                )
        if "order" in sort:
            sort_order = _string(sort["order"], "sort.order")
            if sort_order not in ("asc", "desc"):
                raise validation_error("sort.order must be asc or desc", "sort.order")

    return SearchRequest(
        elements=tuple(elements),
        filters=filters,
        page_index=page - first_page,
        page_size=page_size,
        sort_field=sort_field,
        sort_order=sort_order,
        incognito=incognito,
    )
