"""Decoding and encoding of the wire format, against recorded sample responses."""

from __future__ import annotations

import datetime
import gc
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

import asyncsearch
import asyncsearch.models
from asyncsearch import (
    ExtractionJob,
    LinkPreview,
    ResponseValidationError,
    SearchFilters,
    SearchPage,
    WebhookLog,
)
from asyncsearch import _protocol as protocol
from asyncsearch._models import WebhookLogList, embedding_matrices

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def _assert_all_filled(value: Any, path: str = "$") -> None:
    """Every field of every Struct reachable from value is set, and no list is empty."""
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            field_value = getattr(value, name)
            assert field_value is not None, f"{path}.{name} is None"
            _assert_all_filled(field_value, f"{path}.{name}")
    elif isinstance(value, list):
        assert value, f"{path} is empty"
        for i, item in enumerate(value):
            _assert_all_filled(item, f"{path}[{i}]")


def test_real_shaped_hit_decodes_every_field() -> None:
    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    _assert_all_filled(page)
    hit = page.hits[0]
    assert page.total == 42
    assert page.has_more is True
    assert len((hit.embeddings is not None and hit.embeddings.small3_512) or []) == 512
    assert hit.embeddings is not None
    assert len(hit.embeddings.clip2) == 768
    assert hit.label is not None
    assert hit.label.id == 3
    assert hit.size == 482113
    assert isinstance(hit.size, int)
    # Timestamps whose format the spec does not document stay strings, exactly as sent.
    assert hit.created_at == "2024-05-01T09:00:00.000Z"
    assert hit.data is not None
    assert hit.data.attributes is not None
    assert hit.data.attributes.document is not None
    assert hit.data.attributes.document.creation_date == "D:20240501090000Z"
    assert hit.data.attributes.document.structured == {"total": 1200.5}
    assert hit.preferences == {"view": "grid"}


def test_embeddings_keep_their_wire_name_on_encode() -> None:
    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    encoded = json.loads(msgspec.json.encode(page))
    embeddings = encoded["hits"][0]["embeddings"]
    assert set(embeddings) == {"small3_512", "clip2"}
    assert "small3512" not in msgspec.json.encode(page).decode()


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("search_page.json", SearchPage),
        ("extraction_job.json", ExtractionJob),
        ("webhook_log.json", WebhookLog),
        ("webhook_logs.json", WebhookLogList),
        ("link_preview.json", LinkPreview),
    ],
)
def test_encode_gives_the_wire_form_back(name: str, model: type[msgspec.Struct]) -> None:
    raw = json.loads(sample(name))
    decoded = msgspec.json.decode(sample(name), type=model)
    assert _normalize_times(json.loads(msgspec.json.encode(decoded))) == _normalize_times(raw)
    _assert_all_filled(decoded)


def _normalize_times(value: Any) -> Any:
    """Read ISO 8601 timestamps as datetimes: msgspec may write the same instant differently."""
    if isinstance(value, dict):
        return {k: _normalize_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize_times(v) for v in value]
    if isinstance(value, str) and value.endswith("Z") and value[:4].isdigit():
        return datetime.datetime.fromisoformat(value)
    return value


def test_extraction_job_documented_timestamps_are_datetimes() -> None:
    job = msgspec.json.decode(sample("extraction_job.json"), type=ExtractionJob)
    assert job.created_at == datetime.datetime(2024, 5, 1, 9, 0, 0, 123000, tzinfo=datetime.UTC)
    assert job.extraction is not None
    assert job.extraction.document is not None
    assert isinstance(job.extraction.document.creation_date, datetime.datetime)
    assert job.extraction.document.structured == {"lines": [1, 2]}
    assert job.extraction.media is not None
    assert job.extraction.media.frame_rate == pytest.approx(29.97)
    assert job.extraction.media.dominant_colors[0].rgb == [255, 128, 0]


def test_webhook_logs() -> None:
    log = msgspec.json.decode(sample("webhook_log.json"), type=WebhookLog)
    assert isinstance(log, asyncsearch.WebhookLogSummary)
    assert log.fired_at == "2024-05-01T09:00:01.000Z"  # format not documented: stays str
    assert isinstance(log.created_at, datetime.datetime)
    assert log.created_at.tzinfo is not None
    assert log.request_payload == {"event": "extraction.done"}
    assert log.response_body == "<html>bad gateway</html>"


def test_minimal_hit_with_nulls_absent_and_unknown_fields_decodes() -> None:
    body = {
        "total": 1,
        "hasMore": False,
        "somethingNew": {"x": 1},
        "hits": [
            {
                "id": "h1",
                "kind": "brand-new-kind",
                "stateProcessing": "some-new-state",
                "root": {"id": "r", "type": "NEW_TYPE", "subtype": "new"},
                "tags": None,
                "chats": None,
                "chunks": None,
                "publishedAncestors": None,
                "mimeType": None,
                "label": None,
                "data": {"keywords": None, "attributes": {"document": {"documentType": "new"}}},
                "embeddings": {"small3_512": None},
                "unknownField": [1, 2, 3],
            }
        ],
    }
    page = msgspec.json.decode(json.dumps(body), type=SearchPage)
    hit = page.hits[0]
    assert hit.kind == "brand-new-kind"
    assert hit.root is not None
    assert hit.root.type == "NEW_TYPE"
    # null and absent arrays both read as empty lists; absent scalars read as None.
    assert hit.tags == []
    assert hit.chats == []
    assert hit.chunks == []
    assert hit.published_ancestors == []
    assert hit.data is not None
    assert hit.data.keywords == []
    assert hit.embeddings is not None
    assert hit.embeddings.small3_512 == []
    assert hit.embeddings.clip2 == []
    assert hit.score is None
    assert hit.name is None
    assert hit.comment_pinned is None


def test_absent_score_chunks_embeddings_decode() -> None:
    page = msgspec.json.decode(b'{"total":0,"hasMore":false,"hits":[{"id":"x"}]}', type=SearchPage)
    assert page.hits[0].score is None
    assert page.hits[0].chunks == []
    assert page.hits[0].embeddings is None


def test_absent_hits_reads_as_empty() -> None:
    page = msgspec.json.decode(b'{"total":0,"hasMore":false}', type=SearchPage)
    assert page.hits == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (b'{"total":1,"hasMore":false,"hits":[{"id":"a","score":"high"}]}', "$.hits[0].score"),
        (b'{"hasMore":false,"hits":[]}', "$"),
        (b'{"total":1,"hits":[]}', "$"),
        (b'{"total":1,"hasMore":false,"hits":[{"name":"no id"}]}', "$.hits[0]"),
        (
            b'{"total":5,"hasMore":true,"hits":[{"id":"a"},{"id":"b"},{"id":"c"},'
            b'{"id":"d","score":"x"}]}',
            "$.hits[3].score",
        ),
        (
            b'{"total":1,"hasMore":false,"hits":[{"id":"a","label":{"id":"3"}}]}',
            "$.hits[0].label.id",
        ),
        (b"[1, 2]", "$"),
    ],
)
def test_wrong_types_raise_response_validation_error_with_path(body: bytes, path: str) -> None:
    with pytest.raises(ResponseValidationError) as info:
        protocol.decode_body(msgspec.json.Decoder(SearchPage), body)
    assert info.value.path == path
    assert info.value.body == body
    assert path in str(info.value)


@pytest.mark.parametrize(
    "body",
    [b"", b"<html>oops</html>", b'{"total": 1, "hasMo', b"\xff\xfe{}", b"not json"],
)
def test_non_json_raises_response_validation_error(body: bytes) -> None:
    with pytest.raises(ResponseValidationError) as info:
        protocol.decode_body(msgspec.json.Decoder(SearchPage), body)
    assert info.value.path is None
    assert info.value.body == body


def test_webhook_log_list_requires_items() -> None:
    with pytest.raises(ResponseValidationError):
        protocol.decode_body(msgspec.json.Decoder(WebhookLogList), b"{}")


def test_request_structs_omit_unset_fields() -> None:
    filters = SearchFilters(kinds=["document"])
    assert msgspec.json.encode(filters) == b'{"kinds":["document"]}'
    assert msgspec.json.encode(asyncsearch.models.SearchRequest()) == b"{}"


def test_public_models_are_gc_free_structs() -> None:
    # gc=False keeps 1000-hit pages out of the cycle collector (see the benchmarks): the many
    # objects of a page (hits, chunks, vectors) are never tracked.
    for model in (
        asyncsearch.SearchHit,
        asyncsearch.models.Embeddings,
        asyncsearch.models.SearchChunk,
    ):
        assert model.__struct_config__.gc is False
    # The one top-level object of an answer is (msgspec requires gc with dict=True, which holds
    # its request_id): one tracked object beside the hits' list, which the collector tracks anyway.
    for model in (SearchPage, ExtractionJob, asyncsearch.WebhookLog, asyncsearch.LinkPreview):
        assert model.__struct_config__.gc is True
        assert model.__struct_config__.dict is True
    page = msgspec.json.decode(
        b'{"total": 1, "hasMore": false, "hits": [{"id": "a"}]}', type=SearchPage
    )
    assert not gc.is_tracked(page.hits[0])


def test_webhook_log_list_null_items_reads_as_empty() -> None:
    logs = protocol.decode_body(msgspec.json.Decoder(WebhookLogList), b'{"items": null}')
    assert logs.items == []


def test_only_structs_that_need_it_pay_for_post_init() -> None:
    # msgspec calls __post_init__ for every decoded object: keep it off the Structs without
    # arrays or documented timestamps (above all the parts of a search hit).
    for name in asyncsearch._models.__all__:
        cls = getattr(asyncsearch._models, name)
        if not (isinstance(cls, type) and issubclass(cls, asyncsearch._models._Wire)):
            continue
        needs = bool(getattr(cls, "_list_fields", ())) or bool(
            getattr(cls, "_timestamp_fields", ())
        )
        assert hasattr(cls, "__post_init__") is needs, name
    assert not hasattr(asyncsearch.models.User, "__post_init__")
    assert not hasattr(asyncsearch.models.DocumentAttributes, "__post_init__")
    assert hasattr(SearchPage, "__post_init__")
    assert hasattr(ExtractionJob, "__post_init__")


def test_a_struct_made_by_hand_keeps_text_that_does_not_read() -> None:
    assert ExtractionJob(id="j", created_at="2024-02-04\ud800").created_at == "2024-02-04\ud800"
    # A date alone has no offset: kept as sent rather than made a naive (or guessed) midnight.
    assert ExtractionJob(id="j", created_at="2024-02-04").created_at == "2024-02-04"


# Documented timestamps: every form datetime.fromisoformat reads (3.11+) is a datetime, RFC 3339
# as msgspec reads it too (a lowercase t or z), and anything else stays the text as sent.
UTC = datetime.UTC
READ_AS_DATETIME: dict[str, datetime.datetime] = {
    "2024-05-01T09:00:00.123Z": datetime.datetime(2024, 5, 1, 9, 0, 0, 123000, tzinfo=UTC),
    "20240204T170251Z": datetime.datetime(2024, 2, 4, 17, 2, 51, tzinfo=UTC),
    "2024-02-04 17:02:51+01:00": datetime.datetime(
        2024, 2, 4, 17, 2, 51, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    ),
    "2024-02-04T17Z": datetime.datetime(2024, 2, 4, 17, tzinfo=UTC),
    "2024-02-04t17:02:51z": datetime.datetime(2024, 2, 4, 17, 2, 51, tzinfo=UTC),
}
KEPT_AS_TEXT = [
    # ISO 8601 without a UTC offset: which instant it is is not known, so no datetime is made.
    "2024-02-04",
    "20240204",
    "2024-02-04T17:02:51",
    "2024-W05-7",
    "not a date",
    "",
    "2024-13-45",
    "D:20240501090000Z",
    "2024-02-04T17:02:60Z",
    "2",
    "\u0662\u0660\u0662\u0664-02-04",  # other scripts' digits
]


def _job_with(value: str) -> bytes:
    job = json.loads(sample("extraction_job.json"))
    job["createdAt"] = value
    job["extraction"]["document"]["creationDate"] = value
    job["extraction"]["document"]["modificationDate"] = value
    return json.dumps(job).encode()


def _log_with(value: str) -> bytes:
    log = json.loads(sample("webhook_log.json"))
    log["createdAt"] = value
    return json.dumps(log).encode()


@pytest.mark.parametrize("text", list(READ_AS_DATETIME))
def test_documented_timestamps_read_every_iso_form(text: str) -> None:
    expected = READ_AS_DATETIME[text]
    job = protocol.decode_body(protocol._extraction_job_decoder, _job_with(text))
    assert job.extraction is not None
    assert job.extraction.document is not None
    log = protocol.decode_body(protocol._webhook_log_decoder, _log_with(text))
    for value in (
        job.created_at,
        job.extraction.document.creation_date,
        job.extraction.document.modification_date,
        log.created_at,
    ):
        assert isinstance(value, datetime.datetime)
        assert value == expected
        assert value.utcoffset() == expected.utcoffset()
        assert value.tzinfo is not None  # comparable with every other one


@pytest.mark.parametrize("text", KEPT_AS_TEXT)
def test_a_timestamp_that_does_not_read_stays_text_and_never_fails_the_job(text: str) -> None:
    body = _job_with(text)
    job = protocol.decode_body(protocol._extraction_job_decoder, body)
    assert job.extraction is not None
    assert job.extraction.document is not None
    assert job.created_at == text
    assert job.extraction.document.creation_date == text
    assert job.extraction.document.modification_date == text
    assert job.extraction.document.structured == {"lines": [1, 2]}  # the rest is all there
    log = protocol.decode_body(protocol._webhook_log_decoder, _log_with(text))
    assert log.created_at == text
    # Nothing is lost: the wire form gives the text back exactly as it was sent.
    assert json.loads(msgspec.json.encode(job))["createdAt"] == text
    assert json.loads(msgspec.json.encode(log))["createdAt"] == text


def test_a_timestamp_of_the_wrong_type_still_fails() -> None:
    job = json.loads(sample("extraction_job.json"))
    job["createdAt"] = 1714554000
    with pytest.raises(ResponseValidationError) as info:
        protocol.decode_body(protocol._extraction_job_decoder, json.dumps(job).encode())
    assert info.value.path == "$.createdAt"


def test_a_page_without_embeddings_keeps_everything_else() -> None:
    body = sample("search_page.json")
    full = msgspec.json.decode(body, type=SearchPage)
    lean = protocol._parse_search_page_without_embeddings(body)
    assert type(lean) is SearchPage
    assert lean.hits[0].embeddings is None
    full_fields = msgspec.structs.asdict(full.hits[0])
    full_fields.pop("embeddings")
    lean_fields = msgspec.structs.asdict(lean.hits[0])
    assert lean_fields.pop("embeddings") is None
    assert lean_fields == full_fields
    assert (lean.total, lean.has_more) == (full.total, full.has_more)


def test_the_lean_names_are_deprecated_aliases_of_the_one_page_and_hit() -> None:
    assert asyncsearch.LeanSearchPage is SearchPage
    assert asyncsearch.LeanSearchHit is asyncsearch.SearchHit


# -- embeddings decoded on first read ------------------------------------------------------------


def _held(hit: asyncsearch.SearchHit) -> Any:
    """What the hit's ``embeddings`` field holds, without reading it through the property."""
    return msgspec.structs.asdict(hit)["embeddings"]


def test_a_hit_keeps_its_embeddings_as_raw_json_until_read() -> None:
    body = sample("search_page.json")
    page = msgspec.json.decode(body, type=SearchPage)
    hit = page.hits[0]
    held = _held(hit)
    assert type(held) is msgspec.Raw
    # A slice of the answer, as sent: no floats were made.
    assert bytes(held) in body
    assert json.loads(bytes(held)) == json.loads(body)["hits"][0]["embeddings"]
    embeddings = hit.embeddings
    assert type(embeddings) is asyncsearch.models.Embeddings
    assert embeddings.small3_512 == json.loads(body)["hits"][0]["embeddings"]["small3_512"]
    # Decoded once, then kept: the same object on every read.
    assert _held(hit) is embeddings
    assert hit.embeddings is embeddings


def test_a_null_or_absent_embeddings_reads_as_none() -> None:
    null = msgspec.json.decode(b'{"id":"a","embeddings":null}', type=asyncsearch.SearchHit)
    absent = msgspec.json.decode(b'{"id":"b"}', type=asyncsearch.SearchHit)
    assert null.embeddings is None
    assert absent.embeddings is None


def test_a_hit_compares_reprs_and_encodes_as_if_its_vectors_were_read() -> None:
    body = sample("search_page.json")
    lazy = msgspec.json.decode(body, type=SearchPage)
    read = msgspec.json.decode(body, type=SearchPage)
    for hit in read.hits:
        assert hit.embeddings is not None
    assert type(_held(lazy.hits[0])) is msgspec.Raw
    assert lazy == read
    unread = msgspec.json.decode(body, type=SearchPage).hits[0]
    assert (unread != read.hits[0]) is False  # __ne__ reads too
    built = msgspec.structs.replace(read.hits[0])
    assert msgspec.json.decode(body, type=SearchPage).hits[0] == built
    assert repr(msgspec.json.decode(body, type=SearchPage).hits[0]) == repr(built)
    assert "embeddings=Embeddings(small3_512=[" in repr(built)
    # Encoding a page not read gives its wire form back; decoding that gives an equal page.
    fresh = msgspec.json.decode(body, type=SearchPage)
    again = msgspec.json.decode(msgspec.json.encode(fresh), type=SearchPage)
    assert again == read
    encoded = msgspec.json.encode(msgspec.json.decode(body, type=SearchPage))
    assert json.loads(encoded) == json.loads(msgspec.json.encode(read))
    # to_dict() reads the raw vectors for the dict, without keeping them on the hit.
    fresh = msgspec.json.decode(body, type=SearchPage)
    assert fresh.to_dict() == read.to_dict()
    assert type(_held(fresh.hits[0])) is msgspec.Raw
    # Another hit's vectors still make the two unequal.
    other = msgspec.json.decode(body, type=SearchPage)
    changed = json.loads(body)
    changed["hits"][0]["embeddings"]["clip2"][0] += 1.0
    assert msgspec.json.decode(json.dumps(changed).encode(), type=SearchPage) != other


def test_embeddings_can_be_given_and_set() -> None:
    embeddings = asyncsearch.models.Embeddings(small3_512=[1.0], clip2=[2.0])
    hit = asyncsearch.SearchHit(id="a", embeddings=embeddings)
    assert hit.embeddings is embeddings
    hit.embeddings = None
    assert hit.embeddings is None
    assert msgspec.structs.replace(hit, embeddings=embeddings).embeddings is embeddings


def test_a_bad_vector_is_a_typed_error_on_first_read_naming_hit_and_path() -> None:
    page = json.loads(sample("search_page.json"))
    page["hits"][0]["embeddings"]["small3_512"][3] = "oops"
    body = json.dumps(page).encode()
    decoded = protocol._parse_search_page(body)  # the rest of the page is checked here
    hit = decoded.hits[0]
    with pytest.raises(ResponseValidationError) as info:
        _ = hit.embeddings
    assert info.value.path == "$.hits[*].embeddings.small3_512[3]"
    assert repr(hit.id) in str(info.value)
    assert "Expected `float`, got `str`" in str(info.value)
    # Raised again on every read: nothing was stored, nothing is silently None.
    with pytest.raises(ResponseValidationError):
        _ = hit.embeddings
    with pytest.raises(ResponseValidationError, match=r"small3_512\[3\]"):
        decoded.embedding_matrix("small3_512")
    # An embeddings value of the wrong shape altogether fails the same way.
    page["hits"][0]["embeddings"] = [1, 2]
    odd = protocol._parse_search_page(json.dumps(page).encode()).hits[0]
    with pytest.raises(ResponseValidationError, match="Expected `object"):
        _ = odd.embeddings


def test_concurrent_first_reads_from_threads_agree() -> None:
    import threading

    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    hit = page.hits[0]
    start = threading.Barrier(8)
    seen: list[Any] = []

    def read() -> None:
        start.wait(timeout=10)
        seen.append(hit.embeddings)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 8
    assert all(value == seen[0] for value in seen)
    assert type(seen[0]) is asyncsearch.models.Embeddings
    assert _held(hit) in seen  # the last write, one of the values read


def test_embedding_matrix() -> None:
    np = pytest.importorskip("numpy")
    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    hit = page.hits[0]
    page.hits.append(msgspec.structs.replace(hit, id="no-embeddings", embeddings=None))
    small = page.embedding_matrix()
    assert small.shape == (2, 512)
    assert small.dtype == np.float32
    assert hit.embeddings is not None
    assert small[0].tolist() == pytest.approx(hit.embeddings.small3_512, abs=1e-6)
    assert np.isnan(small[1]).all()
    assert page.embedding_matrix("clip2").shape == (2, 768)
    empty = SearchPage(total=0, has_more=False)
    assert empty.embedding_matrix().shape == (0, 0)
    broken = msgspec.structs.replace(
        hit, id="short", embeddings=asyncsearch.models.Embeddings(small3_512=[1.0])
    )
    page.hits.append(broken)
    with pytest.raises(
        ResponseValidationError, match="'short' has 1 small3_512 values where others have 512"
    ):
        page.embedding_matrix()


def test_embedding_matrix_reads_raw_vectors_without_keeping_them() -> None:
    np = pytest.importorskip("numpy")
    body = sample("search_page.json")
    lazy = msgspec.json.decode(body, type=SearchPage)
    read = msgspec.json.decode(body, type=SearchPage)
    assert all(hit.embeddings is not None for hit in read.hits)
    for name in ("small3_512", "clip2"):
        assert np.array_equal(lazy.embedding_matrix(name), read.embedding_matrix(name))
    # Both vectors from one parse of each hit (asyncsearch.arrow), the same matrices.
    both = embedding_matrices(lazy.hits, ("small3_512", "clip2"))
    for name, (matrix, present) in both.items():
        assert np.array_equal(matrix, read.embedding_matrix(name))  # type: ignore[arg-type]
        assert present.tolist() == [True] * len(lazy.hits)
    assert all(type(_held(hit)) is msgspec.Raw for hit in lazy.hits)


def test_embedding_matrix_without_numpy_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tomllib

    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install -e '\.\[numpy\]' in a checkout"):
        page.embedding_matrix()
    # ...and the extra it names exists, and installs numpy.
    pyproject = tomllib.loads((SAMPLES.parent.parent / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["numpy"]
    assert [spec for spec in extra if spec.startswith("numpy")]


# -- to_dict / to_json ---------------------------------------------------------------------------


def test_models_give_their_wire_form_as_dict_and_json() -> None:
    body = (SAMPLES / "extraction_job.json").read_bytes()
    job = msgspec.json.decode(body, type=ExtractionJob)
    as_dict = job.to_dict()
    # Wire names (camelCase), JSON-ready values, and a round trip to the same model.
    assert "workspaceId" in as_dict
    assert "workspace_id" not in as_dict
    assert isinstance(as_dict["createdAt"], str)
    assert json.loads(job.to_json()) == as_dict
    assert msgspec.json.decode(job.to_json(), type=ExtractionJob) == job
    # Request Structs too, leaving unset fields out as on the wire.
    filters = asyncsearch.SearchFilters(kinds=["document"], parent_ids=["p1"])
    assert filters.to_dict() == {"kinds": ["document"], "parentIds": ["p1"]}
    assert filters.to_json() == b'{"kinds":["document"],"parentIds":["p1"]}'


def test_embedding_matrix_of_an_unknown_name_is_a_typed_error() -> None:
    """Issue 47: ``page.embedding_matrix("nope")`` raised a bare KeyError."""
    page = msgspec.json.decode(sample("search_page.json"), type=SearchPage)
    with pytest.raises(
        asyncsearch.InvalidRequestError, match="'small3_512' or 'clip2', got 'nope'"
    ):
        page.embedding_matrix("nope")  # type: ignore[arg-type]
