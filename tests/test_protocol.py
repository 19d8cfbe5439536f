"""The sans-I/O protocol: request building, validation, error mapping, Retry-After, redirects.

No event loop and no network: plain values in, plain values out.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from asyncsearch import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ResponseValidationError,
    SearchFilters,
    SearchPage,
    SearchQuery,
    Sort,
    UnprocessableEntityError,
    image_data_url,
)
from asyncsearch import _protocol as protocol

JOB = "9b2e4c6a-1d3f-4a5b-8c7d-0e1f2a3b4c5d"
LOG = "4c5d6e7f-8a9b-4c0d-9e1f-2a3b4c5d6e7f"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def body_of(request: protocol.Request[Any]) -> Any:
    assert request.body is not None
    return json.loads(request.body)


# -- search request bodies ----------------------------------------------------------------------


def test_search_sends_only_what_was_given() -> None:
    request = protocol.search("annual report")
    assert request.method == "POST"
    assert request.target == "/v2/search"
    assert body_of(request) == {"text": "annual report"}


def test_search_with_only_filters_is_sent_as_is() -> None:
    request = protocol.search(filters={"kinds": ["document"]})
    assert body_of(request) == {"filters": {"kinds": ["document"]}}


def test_search_full_body_uses_wire_names() -> None:
    after = datetime.datetime(
        2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    )
    request = protocol.search(
        "q",
        image="data:image/png;base64,AAAA",
        resource_id=uuid.UUID(JOB),
        filters=SearchFilters(
            kinds=["document"],
            color=[1, 2],
            parent_ids=["p"],
            ancestor_ids=["a"],
            tag_ids=["t"],
            user_ids=["u"],
            created_after=after,
            created_before="2024-12-31T00:00:00Z",
        ),
        precision=0.5,
        queries=[
            {"text": "x"},
            SearchQuery(resource_id=JOB),
            {"filters": {"tagIds": ["t"]}, "precision": 1},
        ],
        incognito=True,
        page=2,
        page_size=50,
        sort={"field": "createdAt", "order": "desc"},
    )
    assert body_of(request) == {
        "text": "q",
        "image": "data:image/png;base64,AAAA",
        "resourceId": JOB,
        "filters": {
            "kinds": ["document"],
            "color": [1, 2],
            "parentIds": ["p"],
            "ancestorIds": ["a"],
            "tagIds": ["t"],
            "userIds": ["u"],
            # An aware datetime is sent in UTC with Z.
            "createdAfter": "2024-01-02T01:04:05Z",
            "createdBefore": "2024-12-31T00:00:00Z",
        },
        "precision": 0.5,
        "queries": [
            {"text": "x"},
            {"resourceId": JOB},
            {"filters": {"tagIds": ["t"]}, "precision": 1.0},
        ],
        "incognito": True,
        "pagination": {"page": 2, "pageSize": 50},
        "sort": {"field": "createdAt", "order": "desc"},
    }


def test_filters_dict_accepts_python_names() -> None:
    request = protocol.search(filters={"parent_ids": ["p"], "created_before": None})
    assert body_of(request) == {"filters": {"parentIds": ["p"]}}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"text": "x" * 256}, "text is 256 characters long; the limit is 255"),
        ({"text": 5}, "text must be a string"),
        ({"image": "data:image/png;base64," + "A" * 600_000}, "the limit is 600000"),
        ({"image": "aGVsbG8="}, "data URL"),
        ({"precision": 1.5}, "precision must be a number from 0 to 1"),
        ({"precision": -0.1}, "precision"),
        ({"precision": float("nan")}, "precision"),
        ({"precision": True}, "precision"),
        ({"resource_id": "not-a-uuid"}, "resource_id must match the UUID pattern"),
        ({"resource_id": JOB.upper()}, "resource_id must match"),
        ({"resource_id": JOB + "\n"}, "resource_id must match"),
        ({"filters": {"kinds": "document"}}, "filters.kinds must be a list of strings"),
        ({"filters": {"color": ["red"]}}, "filters.color[0] must be an integer"),
        ({"filters": {"bogus": 1}}, "filters has an unknown key 'bogus'"),
        ({"filters": [1]}, "filters must be an asyncsearch.SearchFilters or a dict"),
        (
            {"filters": {"created_after": datetime.datetime(2024, 1, 1)}},
            "filters.created_after must be a timezone-aware datetime",
        ),
        ({"filters": {"created_after": 5}}, "filters.created_after"),
        ({"queries": {"text": "x"}}, "queries must be a list"),
        ({"queries": [{"text": "x" * 300}]}, "queries[0].text is 300 characters"),
        ({"queries": [{"resourceId": "../x"}]}, "queries[0].resource_id must match"),
        ({"queries": [{"precision": 2}]}, "queries[0].precision"),
        ({"incognito": "yes"}, "incognito must be a bool"),
        ({"page": -1}, "page must be at least 0"),
        ({"page_size": 0}, "page_size must be at least 1"),
        ({"page": 1.5}, "page must be an integer"),
        ({"sort": {"order": "asc"}}, "sort.field must be a non-empty string"),
        ({"sort": {"field": "name", "order": 1}}, "sort.order"),
        ({"sort": "name"}, "sort must be an asyncsearch.Sort or a dict"),
    ],
)
def test_search_validation_names_the_argument(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        protocol.search(**kwargs)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_limits_are_inclusive() -> None:
    protocol.search("x" * 255, precision=0, image="data:image/png;base64," + "A" * (600_000 - 22))
    protocol.search(precision=1)
    protocol.search(sort=Sort(field="name"))


# -- path parameters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "..",
        "%2e%2e",
        "a/b",
        "a?b",
        "a#b",
        "",
        "ü" * 36,
        JOB + "/..",
        " " + JOB,
        JOB.replace("-", "/"),
    ],
)
def test_ids_that_could_change_the_path_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="job_id must match the UUID pattern"):
        protocol.get_extraction(bad)
    with pytest.raises(InvalidRequestError, match="log_id must match"):
        protocol.get_webhook_log(JOB, bad)


def test_id_types() -> None:
    with pytest.raises(InvalidRequestError, match=r"job_id must be a UUID string or uuid\.UUID"):
        protocol.get_extraction(12345)  # type: ignore[arg-type]
    assert protocol.get_extraction(uuid.UUID(JOB)).target == f"/v2/extract/{JOB}"


def test_get_extraction_targets() -> None:
    assert protocol.get_extraction(JOB).target == f"/v2/extract/{JOB}"
    assert (
        protocol.get_extraction(JOB, format="markdown").target
        == f"/v2/extract/{JOB}?format=markdown"
    )
    assert protocol.get_extraction(JOB).method == "GET"
    assert protocol.get_extraction(JOB).body is None
    with pytest.raises(InvalidRequestError, match="format must be one of json, markdown"):
        protocol.get_extraction(JOB, format="html")


def test_webhook_targets() -> None:
    assert protocol.list_webhook_logs(JOB).target == f"/v2/extract/{JOB}/webhook-logs"
    assert protocol.get_webhook_log(JOB, LOG).target == f"/v2/extract/{JOB}/webhook-logs/{LOG}"


def test_link_preview_encodes_the_url_as_one_query_value() -> None:
    url = "https://example.com/a b?x=1&y=2#frag+plus/é"
    request = protocol.link_preview(url, type="cache")
    assert request.target == (
        "/v2/link?url=https%3A%2F%2Fexample.com%2Fa%20b%3Fx%3D1%26y%3D2%23frag%2Bplus%2F%C3%A9"
        "&type=cache"
    )
    from urllib.parse import parse_qs, urlsplit

    assert parse_qs(urlsplit(request.target).query)["url"] == [url]
    with pytest.raises(InvalidRequestError, match="url must not be empty"):
        protocol.link_preview("")
    with pytest.raises(InvalidRequestError, match="type must be one of cache, link"):
        protocol.link_preview("https://x", type="other")


# -- search arguments, declared once ----------------------------------------------------------


def test_search_params_are_the_search_arguments() -> None:
    # One declaration (SearchParams) drives every search method; text is the positional one.
    assert set(protocol.SearchParams.__annotations__) == {
        "image",
        "resource_id",
        "filters",
        "precision",
        "queries",
        "incognito",
        "page",
        "page_size",
        "sort",
    }
    assert set(protocol.SearchWalkParams.__annotations__) == (
        set(protocol.SearchParams.__annotations__) - {"page"}
    )
    request = protocol.search("q", page=2, page_size=5, precision=0.5)
    assert json.loads(request.body or b"") == {
        "text": "q",
        "precision": 0.5,
        "pagination": {"page": 2, "pageSize": 5},
    }


def test_search_refuses_an_unknown_keyword_like_a_plain_signature() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'pagesize'"):
        protocol.search("q", pagesize=5)  # type: ignore[call-arg]


# -- images --------------------------------------------------------------------------------------


def test_image_data_url_from_bytes_and_path(tmp_path: Path) -> None:
    assert image_data_url(PNG).startswith("data:image/png;base64,iVBORw0KGgo")
    path = tmp_path / "photo.jpg"
    path.write_bytes(b"\xff\xd8\xff" + b"\x00" * 10)
    assert image_data_url(path).startswith("data:image/jpeg;base64,")
    assert image_data_url(b"abc", mime="image/x-custom").startswith("data:image/x-custom;base64,")
    # The result is accepted by search as is.
    protocol.search(image=image_data_url(PNG))


def test_image_data_url_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="cannot tell whether the data is an image"):
        image_data_url(b"plain bytes")
    with pytest.raises(InvalidRequestError, match="the limit is 600000"):
        image_data_url(PNG + b"\x00" * 450_000)
    with pytest.raises(InvalidRequestError, match="cannot read image file"):
        image_data_url(tmp_path / "missing.png")
    with pytest.raises(InvalidRequestError, match="empty"):
        image_data_url(b"")


def test_image_data_url_refuses_what_is_not_an_image(tmp_path: Path) -> None:
    # By extension: a text file of ids is not an image (it used to become text/plain).
    ids = tmp_path / "ids.txt"
    ids.write_text("3f1c2a9e-5b7d-4c1e-9a2b-7d8e9f0a1b2c\n")
    with pytest.raises(InvalidRequestError, match=r"'.*ids.txt' is not an image.*text/plain"):
        image_data_url(ids)
    # By content: a PDF stays a PDF whatever its name says.
    pdf = tmp_path / "scan.png"
    pdf.write_bytes(b"%PDF-1.7\n" + b"\x00" * 20)
    with pytest.raises(InvalidRequestError, match="its content is application/pdf"):
        image_data_url(pdf)
    with pytest.raises(InvalidRequestError, match="application/zip"):
        image_data_url(b"PK\x03\x04" + b"\x00" * 20)
    # An explicit type must be an image type.
    with pytest.raises(InvalidRequestError, match=r"image type \(image/...\), got 'text/plain'"):
        image_data_url(b"abc", mime="text/plain")
    # What really is an image still passes, by signature or by an image extension.
    webp = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 8
    assert image_data_url(webp).startswith("data:image/webp;base64,")
    avif = b"\x00\x00\x00\x1cftypavif" + b"\x00" * 8
    assert image_data_url(avif).startswith("data:image/avif;base64,")
    svg = tmp_path / "logo.svg"
    svg.write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    assert image_data_url(svg).startswith("data:image/svg+xml;base64,")
    # A text file the caller says is an image is the caller's call.
    assert image_data_url(ids, mime="image/png").startswith("data:image/png;base64,")


def test_image_data_url_largest_allowed() -> None:
    # 22 characters of prefix, then 4 characters per 3 bytes.
    n = (600_000 - len("data:image/png;base64,")) // 4 * 3
    assert len(image_data_url(PNG + b"\x00" * (n - len(PNG)))) <= 600_000


# -- base URL, headers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.example.com", "https://api.example.com"),
        ("https://api.example.com/", "https://api.example.com"),
        ("https://api.example.com/api/", "https://api.example.com/api"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://localhost:8000/x", "http://localhost:8000/x"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://127.5.6.7", "http://127.5.6.7"),
        # What a URL path cannot hold as it is goes out percent-encoded (UTF-8)...
        ("https://api.example.com/my api/", "https://api.example.com/my%20api"),
        ("https://api.example.com/d\u00e9p\u00f4t", "https://api.example.com/d%C3%A9p%C3%B4t"),
        ('https://api.example.com/a\\b"c<d>', "https://api.example.com/a%5Cb%22c%3Cd%3E"),
        # ...escapes already there are kept (encoding twice changes nothing), a stray % is one...
        ("https://api.example.com/my%20api", "https://api.example.com/my%20api"),
        ("https://api.example.com/100%/x%2", "https://api.example.com/100%25/x%252"),
        # ...and what a path may hold stays as it is.
        ("https://api.example.com/v1;x=1/a:b@c/~u/!$&'()*+,=", None),
    ],
)
def test_base_url_accepted(url: str, expected: str | None) -> None:
    checked = protocol.check_base_url(url, allow_http=False)
    assert checked == (url if expected is None else expected)
    assert protocol.check_base_url(checked, allow_http=False) == checked


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://api.example.com", "plain http"),
        ("http://10.0.0.1", "plain http"),
        ("ftp://x", "absolute http(s) URL"),
        ("api.example.com", "absolute http(s) URL"),
        ("https://user:pw@api.example.com", "user info"),
        ("https://api.example.com?x=1", "query"),
        ("https://api.example.com:notaport", "not a valid URL"),
        ("https://b\u00fccher.example/api", "IDNA form"),
        ("https://api example.com", "without spaces"),
        ("https://api.example.com/\ud800", "not valid Unicode"),
        ("", "base_url is missing"),
        (None, "base_url is missing"),
    ],
)
def test_base_url_refused(url: Any, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        protocol.check_base_url(url, allow_http=False)


def test_allow_http_allows_plain_http() -> None:
    assert (
        protocol.check_base_url("http://api.example.com", allow_http=True)
        == "http://api.example.com"
    )


def test_refused_base_url_message_never_shows_user_info() -> None:
    with pytest.raises(ConfigurationError) as info:
        protocol.check_base_url("ftp://user:s3cret@host", allow_http=False)
    assert "s3cret" not in str(info.value)


def test_headers_cannot_override_key_or_base() -> None:
    headers = protocol.build_headers(
        api_key="k",
        base_id="b",
        user_agent="ua",
        extra={"X-Api-Key": "evil", "x-service-base-id": "evil", "X-Trace": "1"},
        has_body=True,
    )
    assert headers["X-Api-Key"] == "k"
    assert headers["X-Service-Base-Id"] == "b"
    assert headers["X-Trace"] == "1"
    assert headers["Content-Type"] == "application/json"
    assert "evil" not in headers.values()
    no_base = protocol.build_headers(
        api_key="k", base_id=None, user_agent="ua", extra=None, has_body=False
    )
    assert "X-Service-Base-Id" not in no_base
    assert "Content-Type" not in no_base


# -- redirects ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/v2/other", "https://api.example.com/v2/other"),
        ("https://api.example.com:443/v2/x", "https://api.example.com:443/v2/x"),
        ("https://API.example.com/v2/x#frag", "https://API.example.com/v2/x"),
        ("https://other.example.com/v2/x", None),
        ("https://api.example.com:8443/v2/x", None),
        ("http://api.example.com/v2/x", None),
        ("//other.example.com/x", None),
        ("https://user@api.example.com/x", None),
        ("https://user@other.example.com/x", None),
    ],
)
def test_redirect_target(location: str, expected: str | None) -> None:
    assert protocol.redirect_target("https://api.example.com/v2/search", location) == expected


# -- status errors ---------------------------------------------------------------------------------


def response(
    status: int, body: bytes = b"", headers: dict[str, str] | None = None
) -> protocol.Response:
    return protocol.Response(
        status=status, headers=headers or {}, body=body, url="https://api.example.com/v2/extract/x"
    )


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (409, ConflictError),
        (422, UnprocessableEntityError),
        (429, RateLimitError),
        (500, InternalServerError),
        (502, InternalServerError),
        (599, InternalServerError),
        (418, APIStatusError),
        (302, APIStatusError),
    ],
)
def test_status_errors(status: int, cls: type[APIStatusError]) -> None:
    error = protocol.status_error(
        response(status, b'{"error":{"message":"nope"}}'), method="GET", attempts=1
    )
    assert type(error) is cls
    assert error.status_code == status
    assert error.body == {"error": {"message": "nope"}}
    assert error.method == "GET"
    assert error.url == "https://api.example.com/v2/extract/x"
    assert str(error).startswith(f"{status} ")
    assert "GET /v2/extract/x: nope" in str(error)


def test_status_error_text_body_and_secret_redaction() -> None:
    error = protocol.status_error(
        response(401, b"<html>invalid key SECRET-123</html>"), method="POST", attempts=1
    )
    protocol.Secrets({"SECRET-123"}).scrub(error)  # where an error leaves the client
    assert "SECRET-123" not in str(error)
    assert "SECRET-123" not in repr(error)
    assert error.body == "<html>invalid key [redacted]</html>"


@pytest.mark.parametrize(
    "text",
    [
        "req_01HZX8K3M5N7P9Q2R4S6T8V0W2",  # a request id: the usual text, holding neither name
        "{'X-Api-Key': 'k-1', 'Accept': '*/*'}",
        "x-api-key=k-1; proxy-authorization: Basic dXNlcjpwdw==",
        "PROXY-AUTHORIZATION: Basic dXNlcjpwdw==\r\nHost: h",
        # What the regex's IGNORECASE takes for a name and lower() does not give back as it:
        "X-AP\u0130-KEY: k-1",  # U+0130 for "I"
        "x-ap\u0131-key: k-1",  # U+0131 for "i"
        "Proxy-Author\u0131zat\u0131on: Basic dXNlcjpwdw==",
        "x-api-\u212aey: k-1",  # the Kelvin sign for "K"
        "a key, an author, no header",
    ],
)
def test_credential_headers_are_scrubbed_by_name_in_any_text(text: str) -> None:
    """``redact`` tests the lowered text before it runs the names' regex (the regex is slow on
    every short text, a request id of each answer): it scrubs what the regex alone scrubs."""
    by_regex = protocol._HEADER_IN_TEXT.sub(r"\1" + protocol.REDACTED, text)
    assert protocol.Secrets().redact(text) == by_regex
    if "k-1" in text or "dXNlcjpwdw==" in text:
        assert "k-1" not in by_regex
        assert "dXNlcjpwdw==" not in by_regex


def test_rate_limit_error_carries_retry_after() -> None:
    error = protocol.status_error(response(429), method="GET", attempts=3, retry_after=2.5)
    assert isinstance(error, RateLimitError)
    assert error.retry_after == 2.5
    assert error.attempts == 3
    assert "after 3 attempts" in str(error)


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        (408, True),
        (429, True),
        (500, True),
        (503, True),
        (599, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (409, False),
        (422, False),
        (302, False),
    ],
)
def test_retryable_statuses(status: int, retry: bool) -> None:
    assert protocol.is_retryable_status(status) is retry
    # A request that must not run twice is retried only after answers saying it did not run.
    assert protocol.is_retryable_status(status, idempotent=False) is (status in (408, 429, 503))


@pytest.mark.parametrize(("incognito", "idempotent"), [(None, False), (False, False), (True, True)])
def test_only_an_incognito_search_may_run_twice(incognito: bool | None, idempotent: bool) -> None:
    request = protocol.search("q", incognito=incognito)
    assert request.idempotent is idempotent
    assert protocol.without_embeddings(request).idempotent is idempotent
    assert protocol.get_extraction(JOB).idempotent
    assert protocol.link_preview("https://example.com/").idempotent
    assert protocol.list_webhook_logs(JOB).idempotent
    assert protocol.get_webhook_log(JOB, JOB).idempotent


# -- Retry-After -----------------------------------------------------------------------------------


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "-5"}, None),
        ({"Retry-After": "-0"}, None),
        ({"Retry-After": "+3"}, None),
        ({"Retry-After": " 3 "}, 3.0),
        ({"Retry-After": "3."}, None),
        ({"Retry-After": ".5"}, None),
        ({"Retry-After": "\u0663"}, None),  # ARABIC-INDIC DIGIT THREE: float() reads 3.0
        ({"Retry-After": "\uff13"}, None),  # FULLWIDTH DIGIT THREE
        ({"Retry-After": "1\u0660"}, None),
        ({"Retry-After": "1.\u0665"}, None),
        ({"retry-after-ms": "\u0663\u0660\u0660", "Retry-After": "9"}, 9.0),
        ({"retry-after-ms": "-250", "Retry-After": "9"}, 9.0),
        ({"retry-after-ms": "-250"}, None),
        ({"retry-after-ms": "1.5"}, 0.0015),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": ""}, None),
        ({"Retry-After": "1e400"}, None),
        ({"Retry-After": "99999999"}, 99999999.0),
        ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
        ({"retry-after-ms": "garbage", "Retry-After": "9"}, 9.0),
        ({}, None),
        ({"Retry-After": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        # A date that is not ahead asks for no particular delay: the client's own backoff.
        ({"Retry-After": email.utils.formatdate(NOW - 30, usegmt=True)}, None),
        ({"Retry-After": email.utils.formatdate(NOW, usegmt=True)}, None),
        # Only ASCII dates: email.utils would read other scripts' digits in the day or year.
        (
            {
                "Retry-After": email.utils.formatdate(NOW + 30, usegmt=True).replace(
                    "2023", "\u0662\u0660\u0662\u0663"
                )
            },
            None,
        ),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert protocol.parse_retry_after(headers, now=NOW) == expected


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    top = [protocol.backoff_delay(n, base=0.5, cap=8.0, random=lambda: 1.0) for n in range(1, 8)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert protocol.backoff_delay(3, base=0.5, cap=8.0, random=lambda: 0.0) == 0.0
    assert protocol.backoff_delay(3, base=0.5, cap=8.0, random=lambda: 0.5) == 1.0


def test_without_embeddings_keeps_the_request_and_changes_the_decoding() -> None:
    full = protocol.search("q", page=2)
    lean = protocol.without_embeddings(full)
    assert (lean.method, lean.target, lean.body, lean.endpoint) == (
        full.method,
        full.target,
        full.body,
        full.endpoint,
    )
    body = b'{"total":1,"hasMore":false,"hits":[{"id":"a","embeddings":{"clip2":[1.0]}}]}'
    assert full.parse(body).hits[0].embeddings is not None
    dropped = lean.parse(body)
    assert type(dropped) is SearchPage
    assert dropped.hits[0].embeddings is None
    # The raw slice is gone, not only hidden: nothing of the page refers to the body any more.
    assert msgspec.structs.asdict(dropped.hits[0])["embeddings"] is None


# -- search_page_head: the view a walk decides on before it decodes the page -----------------

HIT = b'{"id":"h1","name":"x","embeddings":{"text":[0.1,0.2]}}'


@pytest.mark.parametrize(
    ("body", "has_more", "ids"),
    [
        (b'{"total":3,"hasMore":true,"hits":[' + HIT + b"]}", True, ["h1"]),
        # A page that does not say hasMore first is read the same.
        (b'{"hits":[' + HIT + b'],"total":3,"hasMore":true}', True, ["h1"]),
        (b' {"hits" : [' + HIT + b'] ,\n"hasMore" : false, "total":3}', False, ["h1"]),
        # A hasMore inside a hit is never read as the page's.
        (b'{"hits":[{"id":"h","hasMore":false}],"total":1,"hasMore":true}', True, ["h"]),
        (b'{"total":0,"hasMore":true,"hits":[]}', True, []),
        (b'{"total":0,"hasMore":false,"hits":null}', False, []),  # a null array reads as []
        # A key said twice: the last one wins, in the view as in the full decode.
        (b'{"total":3,"hasMore":true,"hits":[' + HIT + b'],"hasMore":false}', False, ["h1"]),
    ],
)
def test_the_page_head_agrees_with_the_full_decode_in_any_key_order(
    body: bytes, has_more: bool, ids: list[str]
) -> None:
    head = protocol.search_page_head(body)
    page = protocol.decode_body(protocol._search_page_decoder, body)
    assert (head.has_more, [hit.id for hit in head.hits]) == (has_more, ids)
    assert (head.total, head.has_more) == (page.total, page.has_more)
    assert [hit.id for hit in head.hits] == [hit.id for hit in page.hits]


@pytest.mark.parametrize(
    "body",
    [b'{"total":3,"hits":[' + HIT + b"]}", b'{"total":3,"hasMore":1,"hits":[]}', b"", b"[]"],
)
def test_a_page_head_that_does_not_fit_is_a_validation_error(body: bytes) -> None:
    with pytest.raises(ResponseValidationError):
        protocol.search_page_head(body)


# -- search_page_continues: a hint from the first bytes, on which a walk sends ahead ----------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"total":3,"hasMore":true,"hits":[' + HIT + b"]}", True),
        (b'{"total":3,"hasMore":false,"hits":[' + HIT + b"]}", False),
        (b'{"total":0,"hasMore":true,"hits":[]}', False),  # an empty page ends the walk
        (b'{"hits":[' + HIT + b'],"total":3,"hasMore":true}', False),  # the view decides
        (b'{"total":3,"hasMore":true,"hits": [' + HIT + b"]}", False),
        # A hits key inside an earlier field, or hasMore inside a hit, is never the page's.
        (b'{"meta":{"hits":[{"id":"x"}]},"hasMore":true}', False),
        (b'{"total":3,"hits":[{"id":"h","hasMore":true}]}', False),
        (b'{"note":"a \\"hits\\":[{","total":3,"hasMore":true,"hits":[' + HIT + b"]}", True),
        (b'{"total":3,"hasMore":1,"hits":[' + HIT + b"]}", False),  # not a boolean
        (b'{"total":3,"hits":[' + HIT + b"]}", False),  # no hasMore
        (b'{"total":3,"hasMore":true,"hits":[{', True),  # cut short: the view will say
        (b"", False),
        (b"[]", False),
    ],
)
def test_search_page_continues_reads_the_fields_before_the_hits(
    body: bytes, expected: bool
) -> None:
    assert protocol.search_page_continues(body) is expected


def test_search_page_continues_agrees_with_the_view_when_it_says_more() -> None:
    # Answers with total, hasMore and hits in the order the spec lists them, as the emulator sends.
    for has_more in (True, False):
        for n_hits in (0, 1, 3):
            hits = [{"id": f"h{i}", "name": "x", "score": 0.5} for i in range(n_hits)]
            body = msgspec.json.encode({"total": 9, "hasMore": has_more, "hits": hits})
            head = protocol.search_page_head(body)
            assert protocol.search_page_continues(body) is (head.has_more and bool(head.hits))


# -- a success answer that is not JSON (issue 47) ------------------------------------------


def _not_json(body: bytes) -> ResponseValidationError:
    with pytest.raises(ResponseValidationError) as caught:
        protocol.decode_body(msgspec.json.Decoder(protocol.models.ExtractionJob), body)
    return caught.value


def test_a_body_that_is_not_json_names_status_type_url_and_start() -> None:
    key = "sk-live-0123456789abcdef"
    page = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>" + key.encode()
    error = _not_json(page + b" " * 20 + b"x" * 200)
    url = "https://proxy.example/v2/extract/abc"
    protocol.explain_not_json(
        error,
        status=200,
        content_type="text/html; charset=utf-8",
        url=url,
        secrets=protocol.Secrets({key}),
    )
    message = str(error)
    assert message.startswith(f"the 200 answer of {url} (text/html; charset=utf-8) is not valid")
    assert "it starts with '<!DOCTYPE html> <html><head><title>Sign in</title>" in message
    assert "[redacted]" in message
    assert key not in message
    assert key[:8] not in message  # not even the part of it that fits in the quote
    assert len(message) < 300


def test_a_key_cut_by_the_quote_is_scrubbed_whole() -> None:
    key = "k" * 10 + "SECRETKEY"
    body = b"<p>" + b"a" * (protocol.NOT_JSON_QUOTE - 8) + key.encode()
    error = _not_json(body)
    secrets = protocol.Secrets({key})
    protocol.explain_not_json(error, status=200, content_type=None, url="u", secrets=secrets)
    assert "kkkkk" not in str(error)
    assert "(no Content-Type)" in str(error)


def test_a_json_body_that_does_not_fit_keeps_its_message() -> None:
    error = _not_json(b'{"id": 5}')
    before = str(error)
    protocol.explain_not_json(
        error, status=200, content_type="application/json", url="u", secrets=protocol.Secrets()
    )
    assert str(error) == before
    assert error.path is not None
