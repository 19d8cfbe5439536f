"""msgspec Structs of the wire format: responses (spec 2.1 to 2.4) and search requests (4.1).

Python names are snake_case, wire names camelCase.
``msgspec.json.decode(body, type=SearchPage)`` gives exactly what ``AsyncSearchClient.search``
returns, and ``msgspec.json.encode(model)`` gives the wire form back.

Decoding rules, so that one odd field never fails a whole page:

- ``id`` fields and the paging fields (``total``, ``hasMore``) are required;
- every other field has a default: ``None`` for scalars and objects, an empty list for arrays
  (a ``null`` array also reads as an empty list);
- unknown fields are ignored; enumerated fields whose value sets the spec does not show
  (kind, state, status, type, ...) are plain ``str``;
- a value of the wrong type still fails (the client raises ``ResponseValidationError``);
- timestamps the spec documents as ISO 8601 (``Timestamp`` fields) decode to an aware
  ``datetime`` when RFC 3339 or ``datetime.fromisoformat`` reads them with a UTC offset
  (``2024-02-04T17:02:51Z``, ``20240204T170251Z``, ...) and otherwise (no offset, a date
  alone, no date at all) stay the ``str`` exactly as sent, so one odd timestamp never fails a
  job and every ``datetime`` compares with every other; the timestamps whose format is not
  documented stay ``str``.

Every Struct has ``to_dict()`` (``msgspec.to_builtins``: wire names, JSON-ready values) and
``to_json()`` (``msgspec.json.encode``: the wire form as bytes).

The closed value sets the spec names are ``Literal`` types for arguments: ``ExtractionFormat``
(``format``) and ``LinkType`` (link ``type``); ``IN_PROGRESS_JOB_STATES`` names the job states
known to mean "not finished".
Decoded fields stay ``str``, so a value the server adds later never fails a response.

Response Structs are declared with ``gc=False``: they hold acyclic data, and keeping them out of
the garbage collector makes decoding a 1000-hit page measurably faster. Do not build reference
cycles through them.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, TypeVar

import msgspec

from ._errors import InvalidRequestError, ResponseValidationError, install_hint

__all__ = [
    "IN_PROGRESS_JOB_STATES",
    "Agent",
    "AnonymousIdentity",
    "Chat",
    "CommentPinned",
    "DocumentAttributes",
    "DocumentPreview",
    "DominantColor",
    "Embeddings",
    "Extraction",
    "ExtractionCommon",
    "ExtractionDocument",
    "ExtractionFormat",
    "ExtractionJob",
    "ExtractionMedia",
    "ExtractionWeb",
    "FileLink",
    "Folder",
    "ImageDescriptor",
    "JobLinks",
    "Label",
    "LeanSearchHit",
    "LeanSearchPage",
    "LinkPreview",
    "LinkType",
    "MediaColor",
    "MediaDevice",
    "MediaLocation",
    "Pagination",
    "Parent",
    "PdfRender",
    "PublishedAncestor",
    "ResourceAttributes",
    "ResourceData",
    "Root",
    "SearchChunk",
    "SearchFilters",
    "SearchHit",
    "SearchPage",
    "SearchQuery",
    "SearchRequest",
    "Size",
    "Sort",
    "Tag",
    "Thumbnail",
    "User",
    "WebhookLog",
    "WebhookLogSummary",
]

_T = TypeVar("_T")

if TYPE_CHECKING:
    # numpy is optional at run time (the numpy extra): only type checkers import it here.
    import numpy
    import numpy.typing

if TYPE_CHECKING:
    # Type checkers see a plain list: after decoding it always is one (see ``_Wire``).
    List = list[_T]
else:
    # At run time a wire ``null`` must decode too; ``_Wire.__post_init__`` turns it into [].
    from typing import Optional

    List = Optional[list[_T]]  # noqa: UP045 - a generic alias needs the subscriptable form

#: ``format`` of ``GET /v2/extract/{jobId}`` (spec 4.2: the enum json, markdown).
ExtractionFormat = Literal["json", "markdown"]
#: ``type`` of ``GET /v2/link`` (spec 4.3: the enum cache, link).
LinkType = Literal["cache", "link"]
#: The job states known to mean "not finished yet": ``pending``, the one state the spec names.
#: The spec shows no other state, so no other value is assumed to mean anything:
#: ``wait_for_extraction`` stops waiting once a job's state is not one of these, whatever it is
#: (its ``in_progress=`` adds the states a service is known to use, such as the bundled
#: emulator's ``processing``), and ``ExtractionJob.state`` stays ``str``.
IN_PROGRESS_JOB_STATES: frozenset[str] = frozenset({"pending"})

#: A number the spec leaves untyped (``size``, ``width``, ...): integers stay ``int``.
Number = int | float

if TYPE_CHECKING:
    #: A timestamp the spec documents as ISO 8601: a ``datetime`` when it reads as one, else the
    #: text exactly as sent (see ``_WireWithTimestamps``).
    Timestamp = datetime.datetime | str
else:
    # msgspec allows one str-like type per union, and reads datetimes as RFC 3339 only: these
    # fields are decoded as str and read in __post_init__, more leniently.
    Timestamp = str


def _read_timestamp(text: str) -> datetime.datetime | str:
    """A documented timestamp as an aware ``datetime``, or ``text`` unchanged.

    ``datetime.fromisoformat`` first (it reads RFC 3339 and, since Python 3.11, most of
    ISO 8601: basic forms, week dates, hours without minutes), then msgspec's RFC 3339 reader
    for what it alone takes (a lowercase ``t`` or ``z``). A value without a UTC offset (a date
    alone, a local time) stays the text as sent: the spec says timestamps end in ``Z``, and
    guessing a time zone would make a ``datetime`` that cannot be compared with aware ones.
    """
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        try:
            value = msgspec.convert(text, datetime.datetime)
        except ValueError:  # msgspec.ValidationError, or a lone surrogate in a Struct by hand
            return text
    return text if value.tzinfo is None else value


class _Serializable:
    """``to_dict()`` and ``to_json()`` for every Struct, in wire form (camelCase names)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The wire form as JSON-ready builtins (``msgspec.to_builtins``): camelCase keys,
        timestamps as ISO 8601 strings."""
        # The enc_hook reads what msgspec cannot make builtins of: a hit's embeddings not read
        # yet (a msgspec.Raw), without keeping the result on the hit.
        result: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_builtins_of_raw)
        return result

    def to_json(self) -> bytes:
        """The wire form as JSON bytes (``msgspec.json.encode``)."""
        return msgspec.json.encode(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The model of its wire form as ``to_dict()`` gives it.

        ``Model.from_dict(m.to_dict()) == m``. (``msgspec.convert`` cannot fill a hit's
        embeddings, kept as raw JSON text.)

        Args:
            data: The wire form: camelCase keys, timestamps as ISO 8601 strings.

        Returns:
            The model.

        Raises:
            InvalidRequestError: ``data`` does not fit the model; the message says where.
        """
        try:
            return msgspec.json.decode(msgspec.json.encode(data), type=cls)
        except (msgspec.ValidationError, msgspec.EncodeError, TypeError) as exc:
            raise InvalidRequestError(f"{cls.__name__}.from_dict(): {exc}") from None


class _Wire(_Serializable, msgspec.Struct, rename="camel", kw_only=True, gc=False):
    """Base of the response Structs: camelCase on the wire."""


class _Answer:
    """Mixin of the Structs an endpoint returns: they carry the request id of their answer.

    Such a class is declared with ``dict=True`` (and so ``gc=True``, which msgspec requires with
    it): ``request_id`` is an attribute in the instance's ``__dict__``, not a field, so that it
    never appears in ``to_dict()``, ``to_json()``, ``msgspec.json.encode``, ``==`` or ``repr()``.
    Only the top-level object of an answer has it; the hits of a page do not.
    """

    __slots__ = ()

    #: The id the service gave the answer this object came in (``X-Request-Id``, else
    #: ``Request-Id``), to quote to its operators; ``None`` when the answer had none, or when
    #: the object was not returned by a client call (decoded or built by your own code). The
    #: same value as ``APIResponse.request_id``; not a wire field.
    request_id: ClassVar[str | None] = None


def set_request_id(value: object, request_id: str | None) -> None:
    """Give the top-level object of an answer its request id (see ``_Answer``)."""
    if request_id is not None and isinstance(value, _Answer):
        value.__dict__["request_id"] = request_id


class _WireWithTimestamps(_Wire):
    """Base of the response Structs with documented timestamps, read in ``__post_init__``.

    Only these classes (jobs, their documents, webhook logs) pay for it; search hits, whose
    timestamps are not documented and stay ``str``, do not.
    """

    _timestamp_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in self._timestamp_fields:
            value = getattr(self, name)
            if type(value) is str:
                setattr(self, name, _read_timestamp(value))


class _WireWithLists(_Wire):
    """Base of the response Structs with array fields: a ``null`` array reads as [].

    Only these classes pay for ``__post_init__``, which msgspec calls for every decoded object.
    """

    _list_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in self._list_fields:
            if getattr(self, name) is None:
                setattr(self, name, [])


# ---------------------------------------------------------------------------------------------
# Shared parts
# ---------------------------------------------------------------------------------------------


class User(_Wire):
    """A user (spec 2.1.1)."""

    id: str
    name: str | None = None
    picture_url_cdn: str | None = None


class ImageDescriptor(_Wire):
    """An image reference with its size and type (spec 2.1.2)."""

    url: str | None = None
    width: Number | None = None
    height: Number | None = None
    mime: str | None = None


class FileLink(_Wire):
    """A link to a produced file (transcript, PDF render, html, reader) with size and type."""

    url: str | None = None
    size: Number | None = None
    mime: str | None = None


# ---------------------------------------------------------------------------------------------
# 2.1 Search hit
# ---------------------------------------------------------------------------------------------


class AnonymousIdentity(_Wire):
    """Who wrote a comment when not signed in."""

    display_name: str | None = None
    session_hash: str | None = None


class CommentPinned(_WireWithLists):
    """The comment pinned on a resource."""

    _list_fields = ("mentioned_users",)

    id: str
    content: str | None = None
    created_at: str | None = None
    modified_at: str | None = None
    resource_id: str | None = None
    anonymous_identity: AnonymousIdentity | None = None
    user: User | None = None
    mentioned_users: List[User] = []


class Label(_Wire):
    """A colour label; its ``id`` is an integer."""

    id: int
    hex_color: str | None = None


class Parent(_Wire):
    """The folder a resource sits in."""

    id: str
    name: str | None = None


class Folder(_Wire):
    """The folder of a root."""

    id: str
    name: str | None = None
    is_locked: bool | None = None
    is_password_protected: bool | None = None
    user: User | None = None


class Root(_Wire):
    """The root a resource belongs to; ``type`` and ``subtype`` are open enums (plain str)."""

    id: str
    type: str | None = None
    subtype: str | None = None
    is_private: bool | None = None
    folder: Folder | None = None


class Tag(_Wire):
    """A tag on a resource."""

    id: str
    name: str | None = None


class Agent(_Wire):
    """The agent of a chat."""

    id: str


class Chat(_Wire):
    """A chat attached to a resource."""

    id: str
    name: str | None = None
    is_pinned: bool | None = None
    created_at: str | None = None
    modified_at: str | None = None
    agent: Agent | None = None


class Thumbnail(_Wire):
    """Thumbnail URLs by size."""

    sm: str | None = None
    md: str | None = None
    lg: str | None = None
    xl: str | None = None
    original: str | None = None


class PublishedAncestor(_Wire):
    """A published ancestor of a resource and its access token."""

    resource_id: str | None = None
    access_token: str | None = None


class DocumentAttributes(_Wire):
    """Document metadata of a resource; timestamps stay ``str`` (their format is not documented)."""

    pages: int | None = None
    author: str | None = None
    title: str | None = None
    subject: str | None = None
    keywords: str | None = None
    producer: str | None = None
    creator: str | None = None
    security: bool | None = None
    version: str | None = None
    creation_date: str | None = None
    modification_date: str | None = None
    document_type: str | None = None
    structured: Any = None


class Size(_Wire):
    """Width and height."""

    width: Number | None = None
    height: Number | None = None


class ResourceAttributes(_Wire):
    """Attributes of a resource's data: document metadata, dimensions, cover."""

    document: DocumentAttributes | None = None
    dimensions: Size | None = None
    cover: ImageDescriptor | None = None


class DocumentPreview(_Wire):
    """An HTML preview of a document."""

    html: str | None = None


class PdfRender(_Wire):
    """Where the PDF render of a resource is stored."""

    storage_path: str | None = None
    url: str | None = None


class ResourceData(_WireWithLists):
    """The ``data`` object of a resource (spec 2.1.3)."""

    _list_fields = ("keywords",)

    infected: bool | None = None
    document_preview: DocumentPreview | None = None
    caption: str | None = None
    keywords: List[str] = []
    attributes: ResourceAttributes | None = None
    pdf_render: PdfRender | None = None


class SearchChunk(_Wire):
    """A matched chunk of a hit's content (spec 2.1.4)."""

    text: str | None = None
    sequence: int | None = None
    page_number: int | None = None
    time_start: float | None = None
    time_end: float | None = None
    score: float | None = None


class Embeddings(_WireWithLists):
    """The hit's embedding vectors ``small3_512`` and ``clip2`` (widths not documented)."""

    _list_fields = ("small3_512", "clip2")

    # rename="camel" would send this as "small3512": the wire name is spelled out.
    small3_512: List[float] = msgspec.field(default_factory=list, name="small3_512")
    clip2: List[float] = []


class _HitFields(_WireWithLists):
    """The fields of a search hit; ``SearchHit`` adds the reading of ``embeddings`` on first use.

    At run time the ``embeddings`` slot holds what was decoded: the hit's ``embeddings`` JSON as
    a ``msgspec.Raw`` (a slice of the answer's bytes, not parsed), or ``None``, or an
    ``Embeddings`` once read (or given). Type checkers see the type ``SearchHit.embeddings``
    returns. The slot is declared here and the property that reads it in ``SearchHit``, so that
    the field keeps its name (``SearchHit(embeddings=...)``, ``msgspec.structs.replace``) while
    attribute access goes through the property (a subclass's property wins over the base's slot).

    Chosen over the alternatives measured or tried: a field of type ``Embeddings`` with a decode
    hook gets its value only after msgspec has built the floats (nothing saved); a private field
    ``_embeddings`` renamed ``embeddings`` on the wire would show as ``_embeddings`` in
    ``repr``, ``asdict`` and the constructor; ``Raw | None`` makes msgspec read only ``null``.
    The raw text is checked when read, not when parsed: msgspec cannot check ``list[float]``
    without building the floats, which is the cost saved.
    """

    _list_fields = ("tags", "chats", "published_ancestors", "chunks")

    id: str
    kind: str | None = None
    mime_type: str | None = None
    extension: str | None = None
    name: str | None = None
    description: str | None = None
    size: Number | None = None
    url: str | None = None
    comment_pinned: CommentPinned | None = None
    label: Label | None = None
    parent: Parent | None = None
    cover: ImageDescriptor | None = None
    user: User | None = None
    root: Root | None = None
    state_processing: str | None = None
    origin_url: str | None = None
    tags: List[Tag] = []
    chats: List[Chat] = []
    thumbnail: Thumbnail | None = None
    file_url: str | None = None
    preferences: Any = None
    is_password_protected: bool | None = None
    is_locked: bool | None = None
    published_ancestors: List[PublishedAncestor] = []
    created_at: str | None = None
    modified_at: str | None = None
    data: ResourceData | None = None
    score: float | None = None
    chunks: List[SearchChunk] = []
    if TYPE_CHECKING:
        embeddings: Embeddings | None = None
    else:
        # Raw, not Embeddings: skipping the ~1,300 numbers of a hit while parsing costs a third
        # of building them as floats (benchmarks/decode.py). msgspec's Raw decoded from ``bytes``
        # references the answer's buffer: no copy is made. Plain Raw, not ``Raw | None``
        # (msgspec then reads only null): a wire null is Raw(b"null"), read as None.
        embeddings: msgspec.Raw = None


# The slot of ``embeddings`` (a standard member descriptor, as for any ``__slots__`` class):
# read and written by SearchHit's property and by the functions below, never by callers.
_embeddings_slot = _HitFields.__dict__["embeddings"]
_embeddings_decoder = msgspec.json.Decoder(Embeddings | None)


def own_text(hit: SearchHit) -> SearchHit:
    """``hit``, its unread embeddings made a copy of their text: it holds only its own bytes,
    not the whole answer it came in (a walk hands hits out one by one, and one kept would keep
    its page's body alive)."""
    held = _embeddings_slot.__get__(hit)
    if type(held) is msgspec.Raw:
        _embeddings_slot.__set__(hit, held.copy())
    return hit


def _decode_vector_json(
    decoder: msgspec.json.Decoder[_T], hit_id: str, raw: msgspec.Raw, where: str
) -> _T:
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        match = re.fullmatch(r"(.*) - at `\$([^`]*)`", str(exc), flags=re.DOTALL)
        reason, at = (match.group(1), match.group(2)) if match else (str(exc), where)
        path = f"$.hits[*].embeddings{at}"
        raise ResponseValidationError(
            f"hit {hit_id!r}: its embeddings do not fit Embeddings at {path}: {reason}",
            path=path,
            body=bytes(raw),
        ) from None


def _builtins_of_raw(value: Any) -> Any:
    # enc_hook of to_dict(): a hit's embeddings not read yet, as read (to_builtins has no Raw).
    if type(value) is msgspec.Raw:
        return msgspec.to_builtins(_decode_vector_json(_embeddings_decoder, "?", value, ""))
    raise NotImplementedError(f"cannot make builtins of {type(value).__name__}")


class SearchHit(_HitFields):
    """One search result: the resource's fields plus ``score``, ``chunks`` and ``embeddings``.

    ``embeddings`` is decoded on first read: parsing a page keeps each hit's vectors as the raw
    JSON text (a slice of the answer's bytes), and reading ``hit.embeddings`` parses it into an
    ``Embeddings`` (``list[float]`` vectors) and keeps the result. A hit whose vectors are never
    read costs no float objects; ``SearchPage.embedding_matrix`` parses the raw text into a
    float32 array without keeping lists on the hits. A page of hits decoded with
    ``embeddings=False`` holds ``None`` instead. Until every hit's raw text is dropped (read,
    or the page freed), the page keeps the answer's bytes alive; a hit that ``search_hits``
    hands out holds a copy of its own text instead, so one kept never keeps its page's answer.

    A value that does not fit (a string among the numbers, ...) raises
    ``ResponseValidationError`` on that first read, naming the hit and the JSON path, and again
    on every later read; the rest of the page was decoded and checked when it arrived.

    Reading is safe from several tasks or threads at once: the parse is a pure function of the
    immutable raw bytes, the result is stored with a single attribute write, so two concurrent
    first reads each parse, both get equal values, the last write wins, and no reader ever sees
    a half-made value.

    ``==``, ``repr()``, ``to_dict()`` and ``msgspec.json.encode`` treat a hit as if its vectors
    had been read (``==`` and ``repr()`` read them; encoding writes the raw text as it came, so a
    page encodes back to its wire form). ``msgspec.structs.asdict`` and ``msgspec.to_builtins``
    see the field as held: read ``hit.embeddings`` first (``to_dict()`` does it for you).
    """

    if not TYPE_CHECKING:

        @property
        def embeddings(self) -> Embeddings | None:
            value = _embeddings_slot.__get__(self)
            if type(value) is msgspec.Raw:
                value = _decode_vector_json(_embeddings_decoder, self.id, value, "")
                _embeddings_slot.__set__(self, value)
            return value

        @embeddings.setter
        def embeddings(self, value: Embeddings | None) -> None:
            _embeddings_slot.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        self.embeddings, other.embeddings  # noqa: B018 - read, so that both compare decoded
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __repr__(self) -> str:
        self.embeddings  # noqa: B018 - read, so that the repr shows the vectors
        return super().__repr__()

    def __rich_repr__(self) -> Any:
        self.embeddings  # noqa: B018
        return super().__rich_repr__()


#: Deprecated alias of ``SearchHit`` (there is one hit type now); removed in the next release.
LeanSearchHit = SearchHit


class SearchPage(_WireWithLists, _Answer, gc=True, dict=True):
    """One page of search results (the response of ``POST /v2/search``).

    Its hits decode their ``embeddings`` on first read (see ``SearchHit``).
    """

    _list_fields = ("hits",)

    total: int
    has_more: bool
    hits: List[SearchHit] = []

    def embedding_matrix(
        self, name: Literal["small3_512", "clip2"] = "small3_512"
    ) -> numpy.typing.NDArray[numpy.float32]:
        """The page's ``name`` embeddings as one float32 numpy array of shape (hits, dimensions).

        A hit without that embedding gets a row of NaN; the width is taken from the hits.
        Vectors not read yet are parsed from the answer's text into the array (the hits keep
        them unread); read ones are copied. Needs numpy (not a dependency of asyncsearch:
        ``pip install -e '.[numpy]'`` in a checkout).

        Args:
            name: The embedding: ``"small3_512"`` or ``"clip2"``.

        Returns:
            A float32 array of shape (hits, dimensions).

        Raises:
            InvalidRequestError: ``name`` is not an embedding's name.
            ImportError: numpy is not installed (the message says how to install it).
            ResponseValidationError: Hits disagree on the number of dimensions, or a vector
                does not fit.
        """
        if name not in _EMBEDDING_NAMES:
            known = " or ".join(repr(known) for known in _EMBEDDING_NAMES)
            raise InvalidRequestError(f"embedding_matrix(): name must be {known}, got {name!r}")
        matrix: numpy.typing.NDArray[numpy.float32] = embedding_matrices(self.hits, (name,))[name][
            0
        ]
        return matrix


#: Deprecated alias of ``SearchPage`` (there is one page type now); removed in the next release.
LeanSearchPage = SearchPage


# One vector of a hit's raw embeddings, the other one skipped while parsing.
_vector_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(
        msgspec.defstruct(f"_{name}View", [(name, list[float] | None, None)], gc=False) | None
    )
    for name in ("small3_512", "clip2")
}


#: The names of a hit's embeddings (``Embeddings``' fields).
_EMBEDDING_NAMES: Final = ("small3_512", "clip2")


def embedding_matrices(
    hits: Sequence[SearchHit], names: Sequence[Literal["small3_512", "clip2"]]
) -> dict[str, tuple[Any, Any]]:
    """For each of ``names``: the hits' vectors as a float32 matrix and which rows have one.

    The one place a vector matrix is made (``SearchPage.embedding_matrix``,
    ``asyncsearch.arrow``, ``asyncsearch.ray``). A hit without the vector (or with an empty
    one) gets a row of NaN; with no vector at all the matrix has width 0. A hit's raw vectors are
    parsed once for all ``names`` (one name: with a view that skips the other vector) and are
    not kept on the hit; vectors already read are copied. Raises ``ImportError`` without numpy
    and ``ResponseValidationError`` when a vector does not fit or the hits disagree on a width.
    """
    try:
        import numpy as np
    except ImportError as exc:
        raise ImportError(
            "SearchPage.embedding_matrix() needs numpy, which asyncsearch does not depend "
            f"on: {install_hint('numpy')} (or pip install numpy)"
        ) from exc

    # One decode per hit measured faster than one decode of the slices joined into one array
    # (which copies every slice first): ~46 against ~70 ms for one vector of 1000 hits.
    decoder = _vector_decoders[names[0]] if len(names) == 1 else _embeddings_decoder
    columns: dict[str, list[list[float] | None]] = {name: [] for name in names}
    for hit in hits:
        held = _embeddings_slot.__get__(hit)
        if type(held) is msgspec.Raw:
            held = _decode_vector_json(decoder, hit.id, held, "")
        for name, column in columns.items():
            column.append(getattr(held, name) if held is not None else None)
    return {name: _matrix(np, hits, name, vectors) for name, vectors in columns.items()}


def _matrix(np: Any, hits: Sequence[SearchHit], name: str, vectors: list[Any]) -> tuple[Any, Any]:
    present = np.fromiter((bool(v) for v in vectors), dtype=bool, count=len(vectors))
    sizes = {len(v) for v in vectors if v}
    if len(sizes) > 1:
        width = max(sizes)
        hit, size = next(
            (h, len(v)) for h, v in zip(hits, vectors, strict=True) if v and len(v) != width
        )
        raise ResponseValidationError(
            f"the hits' {name} embeddings disagree on their size: hit {hit.id!r} has "
            f"{size} {name} values where others have {width}",
            path=f"$.hits[*].embeddings.{name}",
            body=b"",
        )
    width = sizes.pop() if sizes else 0
    if present.all():
        return np.array(vectors, dtype=np.float32).reshape(len(vectors), width), present
    matrix = np.full((len(vectors), width), np.nan, dtype=np.float32)
    for row, values in enumerate(vectors):
        if values:
            matrix[row] = values
    return matrix, present


class SearchHitId(_Wire):
    """Only the id of a search hit: what a paged walk needs to decide before decoding the rest."""

    id: str


class SearchPageHead(_WireWithLists):
    """A view of a search page that skips everything in the hits but their ids.

    msgspec skips the other fields without building any object (the ~1,300 embedding numbers of a
    hit included), so this reads ``hasMore``, ``total`` and the ids at a fraction of the cost of
    a full ``SearchPage``: enough to send the request for the next page before decoding this one.
    Not part of the public API.
    """

    _list_fields = ("hits",)

    total: int
    has_more: bool
    hits: List[SearchHitId] = []


# ---------------------------------------------------------------------------------------------
# 2.2 Extraction job
# ---------------------------------------------------------------------------------------------


class ExtractionCommon(_WireWithLists):
    """Data extracted from any file."""

    _list_fields = ("keywords",)

    mime_type: str | None = None
    size: Number | None = None
    infected: bool | None = None
    caption: str | None = None
    keywords: List[str] = []
    thumbnail: str | None = None
    chunk_count: int | None = None


class MediaColor(_Wire):
    """Colour information of an image or video."""

    profile: str | None = None
    space: str | None = None
    alpha_channel: bool | None = None
    pixel_format: str | None = None


class MediaLocation(_Wire):
    """Where a photo or video was taken."""

    latitude: float | None = None
    longitude: float | None = None


class MediaDevice(_Wire):
    """The device that made a photo or video."""

    maker: str | None = None
    model: str | None = None
    software: str | None = None


class DominantColor(_WireWithLists):
    """A dominant colour as RGB integers and its share."""

    _list_fields = ("rgb",)

    rgb: List[int] = []
    score: float | None = None


class ExtractionMedia(_WireWithLists):
    """Data extracted from images, audio and video."""

    _list_fields = ("dominant_colors",)

    width: Number | None = None
    height: Number | None = None
    duration: Number | None = None
    codec: str | None = None
    bit_rate: Number | None = None
    frame_rate: Number | None = None
    sample_rate: Number | None = None
    channels: Number | None = None
    color: MediaColor | None = None
    location: MediaLocation | None = None
    device: MediaDevice | None = None
    dominant_colors: List[DominantColor] = []
    ocr: str | None = None
    screenshot: ImageDescriptor | None = None
    transcript: FileLink | None = None


class ExtractionDocument(_WireWithTimestamps):
    """Data extracted from documents; ``structured`` is any JSON value (its shape is not shown).

    ``creation_date`` and ``modification_date`` are a ``datetime``, or the text as sent when it
    does not read as one (see ``Timestamp``).
    """

    _timestamp_fields = ("creation_date", "modification_date")

    pages: int | None = None
    author: str | None = None
    title: str | None = None
    subject: str | None = None
    creator: str | None = None
    producer: str | None = None
    version: str | None = None
    security: bool | None = None
    creation_date: Timestamp | None = None
    modification_date: Timestamp | None = None
    pdf_render: FileLink | None = None
    document_type: str | None = None
    structured: Any = None


class ExtractionWeb(_Wire):
    """Data extracted from a web page."""

    title: str | None = None
    site_name: str | None = None
    description: str | None = None
    url: str | None = None
    image: ImageDescriptor | None = None
    favicon: ImageDescriptor | None = None
    html: FileLink | None = None
    reader: FileLink | None = None


class Extraction(_Wire):
    """The four parts of an extraction result."""

    common: ExtractionCommon | None = None
    media: ExtractionMedia | None = None
    document: ExtractionDocument | None = None
    web: ExtractionWeb | None = None


class JobLinks(_Wire):
    """Links to a job's chunks and download."""

    chunks: str | None = None
    download: str | None = None


class ExtractionJob(_WireWithTimestamps, _Answer, gc=True, dict=True):
    """An extraction job and its result (the response of ``GET /v2/extract/{jobId}``).

    ``created_at`` is a ``datetime``, or the text as sent when it does not read as one.
    """

    _timestamp_fields = ("created_at",)

    id: str
    workspace_id: str | None = None
    user_id: str | None = None
    kind: str | None = None
    name: str | None = None
    url: str | None = None
    state: str | None = None
    created_at: Timestamp | None = None
    extraction: Extraction | None = None
    links: JobLinks | None = None


# ---------------------------------------------------------------------------------------------
# 2.3 Webhook logs
# ---------------------------------------------------------------------------------------------


class WebhookLogSummary(_WireWithTimestamps):
    """One webhook delivery attempt of a job, as listed.

    ``created_at`` is a ``datetime``, or the text as sent when it does not read as one;
    ``fired_at`` (its format is not documented) stays ``str``.
    """

    _timestamp_fields = ("created_at",)

    id: str
    trace_id: str | None = None
    attempt_number: int | None = None
    status: str | None = None
    status_code: int | None = None
    error_message: str | None = None
    fired_at: str | None = None
    created_at: Timestamp | None = None


class WebhookLog(WebhookLogSummary, _Answer, gc=True, dict=True):
    """One webhook delivery attempt with its request payload and response body (any JSON)."""

    request_payload: Any = None
    response_body: Any = None


class WebhookLogList(_WireWithLists):
    """The response of ``GET /v2/extract/{jobId}/webhook-logs``; ``items`` is required."""

    _list_fields = ("items",)

    items: List[WebhookLogSummary]


# ---------------------------------------------------------------------------------------------
# 2.4 Link preview
# ---------------------------------------------------------------------------------------------


class LinkPreview(_Wire, _Answer, gc=True, dict=True):
    """Open-graph data of a URL; ``metadata`` is any JSON value."""

    url: str | None = None
    title: str | None = None
    type: str | None = None
    description: str | None = None
    site_name: str | None = None
    image: ImageDescriptor | None = None
    favicon: ImageDescriptor | None = None
    metadata: Any = None


# ---------------------------------------------------------------------------------------------
# 4.1 Search request bodies: unset fields are left out of the JSON (no ``null`` sent)
# ---------------------------------------------------------------------------------------------


class _Request(_Serializable, msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Base of the request Structs: camelCase on the wire, unset fields omitted."""


class SearchFilters(_Request):
    """Filters of a search. Timestamps take an aware ``datetime`` (sent as ISO 8601, UTC, ``Z``)
    or a string sent as is."""

    kinds: list[str] | None = None
    color: list[int] | None = None
    parent_ids: list[str] | None = None
    ancestor_ids: list[str] | None = None
    tag_ids: list[str] | None = None
    user_ids: list[str] | None = None
    created_after: datetime.datetime | str | None = None
    created_before: datetime.datetime | str | None = None


class Pagination(_Request):
    """Which page of results, and how many per page."""

    page: int | None = None
    page_size: int | None = None


class Sort(_Request):
    """Result order: a field name and an order (their allowed values are not documented)."""

    field: str
    order: str | None = None


class SearchQuery(_Request):
    """One element of ``queries``: resource_id, image or text, or filters and precision."""

    resource_id: str | None = None
    image: str | None = None
    text: str | None = None
    filters: SearchFilters | None = None
    precision: float | None = None


class SearchRequest(_Request):
    """The body of ``POST /v2/search``."""

    text: str | None = None
    image: str | None = None
    resource_id: str | None = None
    filters: SearchFilters | None = None
    precision: float | None = None
    queries: list[SearchQuery] | None = None
    incognito: bool | None = None
    pagination: Pagination | None = None
    sort: Sort | None = None
