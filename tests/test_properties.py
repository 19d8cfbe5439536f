"""Property-based tests: the decoders take anything the spec allows and refuse anything else
with one typed error; request bodies say exactly what was asked.

Response strategies follow the field lists of the spec (section 2), written here as JSON
dicts and never from the SDK's models: nulls where a field is nullable, any optional field left
out, unknown fields added, unknown values of the enumerated strings, any Unicode text, and floats
from the smallest subnormal to the largest double.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from asyncsearch import (
    ExtractionJob,
    InvalidRequestError,
    LinkPreview,
    ResponseValidationError,
    SearchPage,
    WebhookLog,
    WebhookLogSummary,
)
from asyncsearch import _protocol as protocol

from .conftest import JOB_ID, LOG_ID

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Json = Any
Strategy = st.SearchStrategy

# -- building blocks -------------------------------------------------------------------------------

text = st.text(max_size=40)
nullable_text = st.none() | text
integer = st.integers(min_value=-(2**63), max_value=2**63 - 1)
double = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        -0.0,
    ]
)
number = integer | double
nullable_number = st.none() | number
nullable_int = st.none() | integer
nullable_bool = st.none() | st.booleans()
spec_uuid = st.uuids(version=4).map(str)


def open_enum(*known: str) -> Strategy[str]:
    """An enumerated string: a known value, or one the client has never seen."""
    return st.sampled_from(known) | text


def iso_timestamp() -> Strategy[str]:
    """ISO 8601 with milliseconds and Z, as the spec shows them."""
    moments = st.datetimes(
        min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2200, 1, 1)
    )
    return moments.map(lambda d: d.isoformat(timespec="milliseconds") + "Z")


any_json: Strategy[Json] = st.recursive(
    st.none() | st.booleans() | number | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
unknown_fields = st.dictionaries(text.map(lambda name: "x-unknown-" + name), any_json, max_size=2)


def obj(required: dict[str, Strategy[Json]], optional: dict[str, Strategy[Json]]) -> Strategy[Json]:
    """A JSON object: every required field, any subset of the optional ones, unknown extras."""
    known = st.fixed_dictionaries(required, optional=optional)
    return st.builds(lambda a, b: {**b, **a}, known, unknown_fields)


def fields(names: str, strategy: Strategy[Json]) -> dict[str, Strategy[Json]]:
    return dict.fromkeys(names.split(), strategy)


def array(element: Strategy[Json], max_size: int = 3) -> Strategy[Json]:
    # The models read a null array as []: a server sending null must not fail a page.
    return st.lists(element, max_size=max_size) | st.none()


user = obj({"id": text}, {"name": nullable_text, "pictureUrlCdn": nullable_text})
image = obj(
    {}, {"url": text, "width": nullable_number, "height": nullable_number, "mime": nullable_text}
)
file_link = obj({}, {"url": text, "size": nullable_number, "mime": nullable_text})

# -- 2.1 search hit --------------------------------------------------------------------------------

comment_pinned = obj(
    {"id": text},
    {
        **fields("content createdAt modifiedAt resourceId", text),
        "anonymousIdentity": obj({}, fields("displayName sessionHash", nullable_text)),
        "user": user,
        "mentionedUsers": array(user),
    },
)
document_attributes = obj(
    {},
    {
        "pages": nullable_int,
        **fields(
            "author title subject keywords producer creator version creationDate modificationDate",
            nullable_text,
        ),
        "security": nullable_bool,
        "documentType": st.none() | open_enum("invoice"),
        "structured": any_json,
    },
)
resource_data = obj(
    {},
    {
        "infected": st.booleans(),
        "documentPreview": obj({}, {"html": nullable_text}),
        "caption": nullable_text,
        "keywords": array(text),
        "attributes": obj(
            {},
            {
                "document": document_attributes,
                "dimensions": obj({}, fields("width height", nullable_number)),
                "cover": image,
            },
        ),
        "pdfRender": obj({}, fields("storagePath url", text)),
    },
)
chunk = obj(
    {},
    {
        "text": text,
        "sequence": integer,
        "pageNumber": integer,
        **fields("timeStart timeEnd score", number),
    },
)
search_hit = obj(
    {"id": text},
    {
        "kind": open_enum("document", "default"),
        **fields("mimeType extension name description originUrl fileUrl", nullable_text),
        "size": nullable_number,
        "url": text,
        "commentPinned": comment_pinned,
        "label": obj({"id": integer}, {"hexColor": text}),
        "parent": obj({"id": text}, {"name": nullable_text}),
        "cover": image,
        "user": user,
        "root": obj(
            {"id": text},
            {
                "type": open_enum("SYSTEM"),
                "subtype": open_enum("DEFAULT"),
                "isPrivate": st.booleans(),
                "folder": obj(
                    {"id": text},
                    {
                        "name": nullable_text,
                        **fields("isLocked isPasswordProtected", st.booleans()),
                        "user": user,
                    },
                ),
            },
        ),
        "stateProcessing": open_enum("pending"),
        "tags": array(obj({"id": text}, {"name": text})),
        "chats": array(
            obj(
                {"id": text},
                {
                    "name": nullable_text,
                    "isPinned": st.booleans(),
                    **fields("createdAt modifiedAt", text),
                    "agent": obj({"id": text}, {}),
                },
            )
        ),
        "thumbnail": obj({}, fields("sm md lg xl original", text)),
        "preferences": any_json,
        **fields("isPasswordProtected isLocked", st.booleans()),
        "publishedAncestors": array(obj({}, fields("resourceId accessToken", text))),
        **fields("createdAt modifiedAt", text),
        "data": resource_data,
        "score": double,
        "chunks": array(chunk),
        "embeddings": obj(
            {}, {"small3_512": array(double, max_size=8), "clip2": array(double, max_size=8)}
        ),
    },
)
search_page = obj({"total": integer, "hasMore": st.booleans()}, {"hits": array(search_hit)})

# -- 2.2 extraction job ----------------------------------------------------------------------------

extraction = obj(
    {},
    {
        "common": obj(
            {},
            {
                "mimeType": nullable_text,
                "size": nullable_number,
                "infected": st.booleans(),
                **fields("caption thumbnail", text),
                "keywords": array(text),
                "chunkCount": integer,
            },
        ),
        "media": obj(
            {},
            {
                **fields(
                    "width height duration bitRate frameRate sampleRate channels", nullable_number
                ),
                "codec": nullable_text,
                "color": obj(
                    {},
                    {
                        **fields("profile space pixelFormat", nullable_text),
                        "alphaChannel": nullable_bool,
                    },
                ),
                "location": obj({}, fields("latitude longitude", st.none() | double)),
                "device": obj({}, fields("maker model software", nullable_text)),
                "dominantColors": array(
                    obj({}, {"rgb": array(st.integers(0, 255)), "score": number})
                ),
                "ocr": text,
                "screenshot": image,
                "transcript": file_link,
            },
        ),
        "document": obj(
            {},
            {
                "pages": integer,
                **fields("author title subject creator producer version", text),
                "security": st.booleans(),
                **fields("creationDate modificationDate", iso_timestamp()),
                "pdfRender": file_link,
                "documentType": open_enum("invoice"),
                "structured": any_json,
            },
        ),
        "web": obj(
            {},
            {
                **fields("title siteName description url", text),
                **fields("image favicon", image),
                **fields("html reader", file_link),
            },
        ),
    },
)
extraction_job = obj(
    {"id": spec_uuid},
    {
        **fields("workspaceId userId", spec_uuid),
        "kind": open_enum("document", "default"),
        **fields("name url", nullable_text),
        "state": open_enum("pending"),
        "createdAt": iso_timestamp(),
        "extraction": extraction,
        "links": obj({}, fields("chunks download", text)),
    },
)

# -- 2.3 webhook log, 2.4 link preview -------------------------------------------------------------

webhook_summary_fields: dict[str, Strategy[Json]] = {
    "traceId": spec_uuid,
    "attemptNumber": integer,
    "status": open_enum("pending"),
    "statusCode": nullable_int,
    **fields("errorMessage firedAt", nullable_text),
    "createdAt": iso_timestamp(),
}
webhook_summary = obj({"id": spec_uuid}, webhook_summary_fields)
webhook_log = obj(
    {"id": spec_uuid},
    {**webhook_summary_fields, **fields("requestPayload responseBody", any_json)},
)
webhook_log_list = obj({"items": st.lists(webhook_summary, max_size=4)}, {})
link_preview = obj(
    {},
    {
        "url": text,
        **fields("title description siteName", nullable_text),
        "type": open_enum("link"),
        **fields("image favicon", image),
        "metadata": any_json,
    },
)

# -- decoding what the spec allows never fails -----------------------------------------------------

PARSERS: dict[str, Callable[[bytes], Any]] = {
    "search": protocol.search("x").parse,
    "extract": protocol.get_extraction(JOB_ID).parse,
    "link": protocol.link_preview("https://example.com").parse,
    "webhook_logs": protocol.list_webhook_logs(JOB_ID).parse,
    "webhook_log": protocol.get_webhook_log(JOB_ID, LOG_ID).parse,
}


def wire(document: Json) -> bytes:
    return json.dumps(document, ensure_ascii=False, allow_nan=False).encode()


def same_float(a: float, b: float) -> bool:
    return a == b and math.copysign(1, a) == math.copysign(1, b)


@SETTINGS
@given(search_page)
def test_any_spec_search_page_decodes(document: Json) -> None:
    page = PARSERS["search"](wire(document))
    assert isinstance(page, SearchPage)
    assert page.total == document["total"]
    assert page.has_more is document["hasMore"]
    hits = document.get("hits") or []
    assert [hit.id for hit in page.hits] == [hit["id"] for hit in hits]
    for decoded, given_hit in zip(page.hits, hits, strict=True):
        if "score" in given_hit:
            assert decoded.score is not None
            assert same_float(decoded.score, given_hit["score"])
        assert decoded.tags is not None
        assert decoded.chunks is not None
    # The wire form of the model decodes back to the same model.
    assert msgspec.json.decode(msgspec.json.encode(page), type=SearchPage) == page


@SETTINGS
@given(extraction_job)
def test_any_spec_extraction_job_decodes(document: Json) -> None:
    job = PARSERS["extract"](wire(document))
    assert isinstance(job, ExtractionJob)
    assert job.id == document["id"]
    assert job.state == document.get("state")
    if "createdAt" in document:
        assert isinstance(job.created_at, datetime.datetime)
        assert job.created_at.tzinfo is not None
        assert (
            job.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            == document["createdAt"]
        )
    assert msgspec.json.decode(msgspec.json.encode(job), type=ExtractionJob) == job


@SETTINGS
@given(webhook_log_list, webhook_log)
def test_any_spec_webhook_log_decodes(listing: Json, detail: Json) -> None:
    summaries = PARSERS["webhook_logs"](wire(listing))
    assert [type(s) for s in summaries] == [WebhookLogSummary] * len(listing["items"])
    assert [s.id for s in summaries] == [item["id"] for item in listing["items"]]
    log = PARSERS["webhook_log"](wire(detail))
    assert isinstance(log, WebhookLog)
    assert log.id == detail["id"]
    assert log.request_payload == detail.get("requestPayload")
    assert log.response_body == detail.get("responseBody")


@SETTINGS
@given(link_preview)
def test_any_spec_link_preview_decodes(document: Json) -> None:
    preview = PARSERS["link"](wire(document))
    assert isinstance(preview, LinkPreview)
    assert preview.title == document.get("title")
    assert preview.type == document.get("type")
    assert preview.metadata == document.get("metadata")


# -- anything else is one typed error --------------------------------------------------------------


def mutated(valid: Strategy[Json]) -> Strategy[bytes]:
    """Valid bodies broken in one place: cut, a byte changed, or a byte inserted."""

    def mutate(body: bytes, position: int, byte: int, how: int) -> bytes:
        at = position % (len(body) + 1)
        if how == 0:
            return body[:at]
        if how == 1:
            return body[:at] + bytes([byte]) + body[at + 1 :]
        return body[:at] + bytes([byte]) + body[at:]

    return st.builds(
        mutate,
        valid.map(wire),
        st.integers(min_value=0),
        st.integers(0, 255),
        st.integers(0, 2),
    )


DOCUMENTS: dict[str, Strategy[Json]] = {
    "search": search_page,
    "extract": extraction_job,
    "link": link_preview,
    "webhook_logs": webhook_log_list,
    "webhook_log": webhook_log,
}


@SETTINGS
@given(
    st.sampled_from(sorted(PARSERS)),
    st.binary(max_size=200) | st.one_of(*(mutated(d) for d in DOCUMENTS.values())),
)
@example("search", b'{"total": 1, "hasMore": false, "hits": [{"id": "\xff"}]}')
@example("extract", b'{"id": "x", "extraction": {"document": {"structured": ' + b"[" * 50_000)
@example("webhook_log", b'{"id": "x", "createdAt": "2024-13-45T99:99:99Z"}')
@example("search", b'{"total": 1e400, "hasMore": true}')
@example("link", b"\xef\xbb\xbf{}")
def test_any_bytes_decode_or_raise_response_validation_error(endpoint: str, body: bytes) -> None:
    try:
        PARSERS[endpoint](body)
    except ResponseValidationError as exc:
        error = exc
    else:
        return
    assert error.body == body
    assert error.path is None or error.path.startswith("$")
    # Nothing else rides along: a codec error would carry the whole body with it.
    assert error.__context__ is None or isinstance(error.__context__, msgspec.MsgspecError)


# -- request bodies say exactly what was asked -----------------------------------------------------

short_text = st.text(min_size=1, max_size=30)
names = st.lists(short_text, max_size=3)
aware = st.datetimes(
    min_value=datetime.datetime(1900, 1, 1),
    max_value=datetime.datetime(2200, 1, 1),
    timezones=st.builds(
        datetime.timezone,
        st.timedeltas(
            min_value=datetime.timedelta(hours=-23), max_value=datetime.timedelta(hours=23)
        ),
    ),
)
timestamp_argument = aware | short_text
image_url = st.binary(min_size=1, max_size=60).map(
    lambda data: "data:image/png;base64," + __import__("base64").b64encode(data).decode()
)
resource_id = st.uuids(version=4).map(str) | st.uuids(version=1)
precision = st.floats(min_value=0, max_value=1) | st.sampled_from([0, 1])

FILTER_NAMES = {
    "kinds": "kinds",
    "color": "color",
    "parent_ids": "parentIds",
    "ancestor_ids": "ancestorIds",
    "tag_ids": "tagIds",
    "user_ids": "userIds",
    "created_after": "createdAfter",
    "created_before": "createdBefore",
}
filters = st.fixed_dictionaries(
    {},
    optional={
        "kinds": names,
        "color": st.lists(integer, max_size=3),
        "parent_ids": names,
        "ancestor_ids": names,
        "tag_ids": names,
        "user_ids": names,
        "created_after": timestamp_argument,
        "created_before": timestamp_argument,
    },
)
query = st.fixed_dictionaries(
    {},
    optional={
        "resource_id": resource_id,
        "image": image_url,
        "text": st.text(max_size=255),
        "filters": filters,
        "precision": precision,
    },
)
sort = st.fixed_dictionaries({"field": short_text}, optional={"order": short_text})


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def expected_timestamp(value: datetime.datetime | str) -> str:
    if isinstance(value, str):
        return value
    return value.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def expected_filters(given_filters: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in given_filters.items():
        wire_name = FILTER_NAMES[key]
        out[wire_name] = expected_timestamp(value) if key.startswith("created") else list(value)
    return out


def expected_query(given_query: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in given_query.items():
        if key == "filters":
            out["filters"] = expected_filters(value)
        elif key == "resource_id":
            out["resourceId"] = str(value)
        elif key == "precision":
            out["precision"] = float(value)
        else:
            out[key] = value
    return out


def wire_keys(given_dict: dict[str, Any], use_wire: bool) -> dict[str, Any]:
    """The same dict with wire (camelCase) keys when ``use_wire``: the client takes both."""
    return {camel(k): v for k, v in given_dict.items()} if use_wire else dict(given_dict)


search_arguments = st.fixed_dictionaries(
    {},
    optional={
        "text": st.text(max_size=255),
        "image": image_url,
        "resource_id": resource_id,
        "filters": filters,
        "precision": precision,
        "queries": st.lists(query, max_size=3),
        "incognito": st.booleans(),
        "page": st.integers(min_value=0, max_value=2**31),
        "page_size": st.integers(min_value=1, max_value=2**31),
        "sort": sort,
    },
)


@SETTINGS
@given(search_arguments, st.booleans())
def test_search_body_round_trips(arguments: dict[str, Any], use_wire: bool) -> None:
    call = dict(arguments)
    if "filters" in call:
        call["filters"] = wire_keys(call["filters"], use_wire)
    if "queries" in call:
        call["queries"] = [wire_keys(q, use_wire) for q in call["queries"]]
    request = protocol.search(**call)
    assert (request.method, request.target) == ("POST", "/v2/search")
    assert request.body is not None
    expected: dict[str, Any] = {}
    for key in ("text", "image", "incognito"):
        if key in arguments:
            expected[key] = arguments[key]
    if "resource_id" in arguments:
        expected["resourceId"] = str(arguments["resource_id"])
    if "precision" in arguments:
        expected["precision"] = float(arguments["precision"])
    if "filters" in arguments:
        expected["filters"] = expected_filters(arguments["filters"])
    if "queries" in arguments:
        expected["queries"] = [expected_query(q) for q in arguments["queries"]]
    if "page" in arguments or "page_size" in arguments:
        expected["pagination"] = wire_keys(
            {k: arguments[k] for k in ("page", "page_size") if k in arguments}, True
        )
    if "sort" in arguments:
        expected["sort"] = arguments["sort"]
    # Compared as plain JSON: SearchFilters' ``datetime | str`` fields cannot be typed back.
    assert json.loads(request.body) == expected


@SETTINGS
@given(
    st.text(st.characters(exclude_categories=()), max_size=300),
    st.text(st.characters(exclude_categories=())),
    st.datetimes(
        timezones=st.builds(
            datetime.timezone,
            st.timedeltas(
                min_value=datetime.timedelta(hours=-23), max_value=datetime.timedelta(hours=23)
            ),
        )
    ),
)
@example(
    "\ud800",
    "https://example.com/\udfff",
    datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
)
def test_any_argument_builds_or_raises_invalid_request_error(
    free_text: str, url: str, moment: datetime.datetime
) -> None:
    """Arbitrary strings (lone surrogates included) and dates at the ends of the calendar."""
    for build in (
        lambda: protocol.search(free_text),
        lambda: protocol.search(filters={"kinds": [free_text]}),
        lambda: protocol.search(sort={"field": free_text}),
        lambda: protocol.search(filters={"createdAfter": moment}),
        lambda: protocol.link_preview(url),
        lambda: protocol.get_extraction(free_text),
    ):
        try:
            request = build()
        except InvalidRequestError:
            continue
        assert request.body is None or json.loads(request.body) is not None
        assert request.target.isascii()


def test_uuid_objects_and_strings_build_the_same_request() -> None:
    as_object = protocol.search(resource_id=uuid.UUID(JOB_ID))
    as_text = protocol.search(resource_id=JOB_ID)
    assert as_object.body == as_text.body


@pytest.mark.parametrize("endpoint", sorted(PARSERS))
def test_each_parser_refuses_an_empty_body(endpoint: str) -> None:
    with pytest.raises(ResponseValidationError, match="empty"):
        PARSERS[endpoint](b"")
