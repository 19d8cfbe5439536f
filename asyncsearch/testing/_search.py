"""Per-base search index and ranking: BM25 keywords mixed with hashing-embedder similarity.

Scores are in [0, 1]. A ``text`` query scores ``0.7 * keyword + 0.3 * vector`` where keyword is
the BM25 score (name counted three times, description, chunk text) divided by the best BM25
score in the base, and vector is the cosine similarity of the query's and the resource's
``small3_512`` vectors clamped to [0, 1]. An ``image`` query scores the cosine similarity with
``clip2``, raised for resources added with an image to how alike the two pictures are (see
``_images``: 1.0 for identical bytes); a ``resourceId`` query the cosine similarity with that
resource's ``small3_512`` (the resource itself is left out). A query object with several of
text, image and resourceId scores the mean of their scores; one with none of them ("browse")
gives every resource that passes the filters the score 1.0. A hit is kept when ``score > 0`` and
``score >= cutoff(precision)``, with ``cutoff(p) = p / 2``.

numpy, when importable, computes the vector part for all resources at once; without it (or with
``HAVE_NUMPY`` set to False) a pure-Python loop computes the same numbers bit for bit, because
vectors are integer counts and both paths perform the same floating-point operations in the
same order.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._embed import CLIP2, SMALL3, HashingEmbedder, image_counts, tokenize
from ._errors import not_found
from ._images import ImageFingerprint, fingerprint, recognised, similarity

if TYPE_CHECKING:
    import numpy.typing as npt

try:
    import numpy as np

    HAVE_NUMPY = True
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    HAVE_NUMPY = False

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_PRECISION",
    "HAVE_NUMPY",
    "MAX_PAGE_SIZE",
    "SORT_FIELDS",
    "Filters",
    "ImageQuery",
    "QuerySpec",
    "SearchIndex",
    "SearchRequest",
    "cutoff",
    "parse_timestamp",
]

DEFAULT_PRECISION = 0.3
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
# Allowed sort fields and the order each takes when ``sort.order`` is not given.
SORT_FIELDS: dict[str, str] = {
    "score": "desc",
    "createdAt": "desc",
    "modifiedAt": "desc",
    "name": "asc",
    "size": "desc",
}
MAX_CHUNKS_PER_HIT = 3

_K1 = 1.2
_B = 0.75
_NAME_BOOST = 3
_KEYWORD_WEIGHT = 0.7
_VECTOR_WEIGHT = 0.3


def cutoff(precision: float) -> float:
    """Return the lowest score a hit may have at this precision (monotone: p / 2)."""
    return precision / 2


def parse_timestamp(value: str) -> float:
    """Return the POSIX time of an ISO 8601 timestamp (naive means UTC); raise ValueError."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


@dataclass(frozen=True, slots=True)
class Filters:
    """The ``filters`` object of a search request; ``None`` or empty means no constraint."""

    kinds: frozenset[str] | None = None
    color: frozenset[int] | None = None
    parent_ids: frozenset[str] | None = None
    ancestor_ids: frozenset[str] | None = None
    tag_ids: frozenset[str] | None = None
    user_ids: frozenset[str] | None = None
    created_after: float | None = None
    created_before: float | None = None

    def matches(self, doc: IndexedResource) -> bool:
        """Return True when the resource passes every given filter."""
        if self.kinds and doc.kind not in self.kinds:
            return False
        if self.color and doc.label_id not in self.color:
            return False
        if self.parent_ids and doc.parent_id not in self.parent_ids:
            return False
        if self.ancestor_ids and self.ancestor_ids.isdisjoint(doc.ancestors):
            return False
        if self.tag_ids and self.tag_ids.isdisjoint(doc.tag_ids):
            return False
        if self.user_ids and doc.user_id not in self.user_ids:
            return False
        if self.created_after is not None and (
            doc.created is None or doc.created <= self.created_after
        ):
            return False
        return not (
            self.created_before is not None
            and (doc.created is None or doc.created >= self.created_before)
        )


class ImageQuery:
    """The picture of a query object: its bytes, their digest and ``clip2`` vector, and once
    ``prepare``d, its fingerprint.

    Equal (and hashed) by digest, so that the same search asked again is recognised. Building
    one costs a SHA-256 of the bytes (microseconds per kilobyte); ``prepare`` decodes the
    picture with Pillow, which the emulator does in its worker thread (Pillow's decoders
    release the GIL, so the event loop keeps running meanwhile).
    """

    __slots__ = ("_fingerprint", "data", "digest", "vector")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.digest = hashlib.sha256(data).digest()
        self.vector = image_counts(data, self.digest)
        self._fingerprint: ImageFingerprint | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageQuery) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"ImageQuery({len(self.data)} bytes, sha256={self.digest.hex()[:12]}...)"

    def needs_decoding(self) -> bool:
        """Return True when only Pillow's decoding of a recognised picture is left to do.

        Otherwise the fingerprint is complete now: bytes Pillow does not recognise (or no
        Pillow) are compared by their digest alone.
        """
        if self._fingerprint is not None:
            return False
        if recognised(self.data):
            return True
        self._fingerprint = ImageFingerprint(self.digest)
        return False

    def prepare(self) -> None:
        """Compute the fingerprint, once (in any thread: nothing else is shared)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.data, digest=self.digest)

    @property
    def fingerprint(self) -> ImageFingerprint:
        """Return the fingerprint compared with added pictures (preparing it if needed)."""
        self.prepare()
        assert self._fingerprint is not None
        return self._fingerprint


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """One query object: the top-level one or an element of ``queries``."""

    text: str | None = None
    image: ImageQuery | None = None
    resource_id: str | None = None
    filters: Filters = field(default_factory=Filters)
    precision: float = DEFAULT_PRECISION


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A validated search request body."""

    elements: tuple[QuerySpec, ...]
    filters: Filters
    page_index: int  # zero-based, whatever the emulator's first page number is
    page_size: int
    sort_field: str
    sort_order: str
    incognito: bool | None = None

    def images_to_decode(self) -> list[ImageQuery]:
        """Return the request's pictures that Pillow still has to decode (see ``prepare``)."""
        return [e.image for e in self.elements if e.image is not None and e.image.needs_decoding()]


@dataclass(slots=True)
class IndexedResource:
    """A stored resource with what search needs to filter, sort and quote it."""

    row: int
    wire: dict[str, Any]
    chunks: list[dict[str, Any]]
    ancestors: frozenset[str]
    id: str
    kind: Any
    label_id: Any
    parent_id: Any
    tag_ids: frozenset[str]
    user_id: Any
    created: float | None
    modified: float | None
    name: str | None
    size: float | None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _timestamp_or_none(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_timestamp(value)
    except ValueError:
        return None


def visual_text(wire: dict[str, Any]) -> list[str]:
    """Return the texts besides name and description a resource's ``clip2`` vector is made of."""
    keywords = _get(wire, "data", "keywords")
    words = (
        " ".join(k for k in keywords if isinstance(k, str)) if isinstance(keywords, list) else ""
    )
    return [_str(_get(wire, "data", "caption")), words]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


class _VectorSpace:
    """All resources' integer vectors of one space, packed row after row in one C int array."""

    def __init__(self, embedder: HashingEmbedder) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.buf: array[int] = array("i")
        self.norms: array[float] = array("d")

    def append(self, tokens: Iterable[str]) -> None:
        counts = self.embedder.counts(tokens)
        dense = array("i", bytes(4 * self.dim))
        for index, value in counts.items():
            dense[index] = value
        self.buf.extend(dense)
        self.norms.append(math.sqrt(sum(v * v for v in counts.values())))

    def row(self, row: int) -> dict[int, int]:
        start = row * self.dim
        chunk = self.buf[start : start + self.dim]
        return {i: v for i, v in enumerate(chunk) if v}

    def wire_vector(self, row: int) -> list[float]:
        """Return the unit vector of a row as the wire carries it (six decimals)."""
        start = row * self.dim
        n = self.norms[row]
        if n == 0.0:
            return [0.0] * self.dim
        # Most entries are zero; skipping round() for them keeps big pages cheap.
        return [round(v / n, 6) if v else 0.0 for v in self.buf[start : start + self.dim]]

    def similarities(
        self, query: dict[int, int], use_numpy: bool
    ) -> Sequence[float] | npt.NDArray[np.float64]:
        """Return the clamped cosine similarity of the query with every row."""
        qn = math.sqrt(sum(v * v for v in query.values()))
        n_rows = len(self.norms)
        if use_numpy:
            return self._similarities_numpy(query, qn, n_rows)
        out: list[float] = []
        if qn == 0.0 or not query:
            return [0.0] * n_rows
        items = sorted(query.items())
        buf = self.buf
        norms = self.norms
        dim = self.dim
        for row in range(n_rows):
            base = row * dim
            dot = 0
            for index, value in items:
                dot += value * buf[base + index]
            denom = qn * norms[row]
            cos = dot / denom if denom > 0.0 else 0.0
            out.append(min(max(cos, 0.0), 1.0))
        return out

    def _similarities_numpy(
        self, query: dict[int, int], qn: float, n_rows: int
    ) -> npt.NDArray[np.float64]:
        if qn == 0.0 or not query or n_rows == 0:
            return np.zeros(n_rows, dtype=np.float64)
        matrix = np.frombuffer(self.buf, dtype=np.intc).reshape(n_rows, self.dim)
        items = sorted(query.items())
        columns = np.array([i for i, _ in items], dtype=np.intp)
        values = np.array([v for _, v in items], dtype=np.int64)
        # Exact integer dot products over the query's non-zero columns only.
        dots = matrix[:, columns].astype(np.int64) @ values
        del matrix  # release the buffer export so the array can grow again
        denom = qn * np.frombuffer(self.norms, dtype=np.float64)
        cos = np.zeros(n_rows, dtype=np.float64)
        np.divide(dots.astype(np.float64), denom, out=cos, where=denom > 0.0)
        return np.clip(cos, 0.0, 1.0)


class SearchIndex:
    """The searchable resources of one base, in insertion order (row = insertion index)."""

    def __init__(self) -> None:
        self.docs: list[IndexedResource] = []
        self.by_id: dict[str, IndexedResource] = {}
        # term -> (rows, weighted term frequencies); rows ascend because docs only get appended.
        self._postings: dict[str, tuple[array[int], array[int]]] = {}
        self._doc_len: array[int] = array("i")
        self._total_len = 0
        self._chunk_count = 0
        self._chunk_tokens = 0
        self.small3 = _VectorSpace(SMALL3)
        self.clip2 = _VectorSpace(CLIP2)
        # row -> fingerprint of the picture of resources added with an image.
        self.images: dict[int, ImageFingerprint] = {}
        # The last search's hits in order, for the next page of the same search: a page walk
        # scores and sorts the whole index once, not once per page. Keyed by everything but the
        # page, and by the number of resources (they are only ever appended).
        self._last_search: tuple[object, list[int], dict[int, tuple[float, tuple[str, ...]]]]
        self._last_search = (None, [], {})

    def __len__(self) -> int:
        return len(self.docs)

    def clone(self) -> SearchIndex:
        """Return an independent copy; stored wire dicts are shared, since none is mutated."""
        other = SearchIndex()
        other.docs = list(self.docs)
        other.by_id = dict(self.by_id)
        other._postings = {
            t: (array("i", r), array("i", f)) for t, (r, f) in self._postings.items()
        }
        other._doc_len = array("i", self._doc_len)
        other._total_len = self._total_len
        other._chunk_count = self._chunk_count
        other._chunk_tokens = self._chunk_tokens
        other.images = dict(self.images)
        for mine, theirs in ((self.small3, other.small3), (self.clip2, other.clip2)):
            theirs.buf = array("i", mine.buf)
            theirs.norms = array("d", mine.norms)
        return other

    def add(
        self,
        wire: dict[str, Any],
        chunks: list[dict[str, Any]],
        ancestors: Iterable[str],
        image: bytes | ImageFingerprint | None = None,
    ) -> IndexedResource:
        """Index a resource's wire dict, its text chunks, its ancestor ids and its picture
        (bytes, or their fingerprint)."""
        rid = wire["id"]
        if rid in self.by_id:
            raise ValueError(f"a resource with id {rid!r} already exists in this base")
        tags = wire.get("tags")
        tag_ids = (
            frozenset(t["id"] for t in tags if isinstance(t, dict) and isinstance(t.get("id"), str))
            if isinstance(tags, list)
            else frozenset()
        )
        size = wire.get("size")
        name = wire.get("name")
        doc = IndexedResource(
            row=len(self.docs),
            wire=wire,
            chunks=chunks,
            ancestors=frozenset(ancestors),
            id=rid,
            kind=wire.get("kind"),
            label_id=_get(wire, "label", "id"),
            parent_id=_get(wire, "parent", "id"),
            tag_ids=tag_ids,
            user_id=_get(wire, "user", "id"),
            created=_timestamp_or_none(wire.get("createdAt")),
            modified=_timestamp_or_none(wire.get("modifiedAt")),
            name=name if isinstance(name, str) else None,
            size=float(size)
            if isinstance(size, int | float) and not isinstance(size, bool)
            else None,
        )
        name_tokens = tokenize(_str(wire.get("name")))
        description_tokens = tokenize(_str(wire.get("description")))
        chunk_tokens = [tokenize(_str(c.get("text"))) for c in chunks]
        self._index_terms(doc.row, name_tokens, description_tokens, chunk_tokens)
        text_tokens = name_tokens + description_tokens
        for tokens in chunk_tokens:
            text_tokens.extend(tokens)
        self.small3.append(text_tokens)
        visual_tokens = name_tokens + description_tokens
        for extra in visual_text(wire):
            visual_tokens.extend(tokenize(extra))
        self.clip2.append(visual_tokens)
        if image is not None:
            self.images[doc.row] = (
                image if isinstance(image, ImageFingerprint) else fingerprint(image)
            )
        self.docs.append(doc)
        self.by_id[rid] = doc
        return doc

    def _index_terms(
        self,
        row: int,
        name_tokens: list[str],
        description_tokens: list[str],
        chunk_tokens: list[list[str]],
    ) -> None:
        counts: Counter[str] = Counter()
        for _ in range(_NAME_BOOST):
            counts.update(name_tokens)
        counts.update(description_tokens)
        for tokens in chunk_tokens:
            counts.update(tokens)
            self._chunk_count += 1
            self._chunk_tokens += len(tokens)
        length = sum(counts.values())
        self._doc_len.append(length)
        self._total_len += length
        for term, tf in counts.items():
            posting = self._postings.get(term)
            if posting is None:
                posting = (array("i"), array("i"))
                self._postings[term] = posting
            posting[0].append(row)
            posting[1].append(tf)

    def _idf(self, term: str) -> float:
        posting = self._postings.get(term)
        df = len(posting[0]) if posting is not None else 0
        n = len(self.docs)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def keyword_scores(self, terms: Sequence[str]) -> dict[int, float]:
        """Return each matching row's BM25 score divided by the best one (so in (0, 1])."""
        n = len(self.docs)
        if n == 0 or not terms:
            return {}
        avgdl = self._total_len / n if self._total_len else 1.0
        raw: dict[int, float] = {}
        doc_len = self._doc_len
        for term in dict.fromkeys(terms):  # each distinct term once, in query order
            posting = self._postings.get(term)
            if posting is None:
                continue
            idf = self._idf(term)
            for row, tf in zip(posting[0], posting[1], strict=True):
                norm = _K1 * (1.0 - _B + _B * doc_len[row] / avgdl)
                raw[row] = raw.get(row, 0.0) + idf * tf * (_K1 + 1.0) / (tf + norm)
        if not raw:
            return {}
        best = max(raw.values())
        return {row: score / best for row, score in raw.items()}

    def matched_chunks(self, doc: IndexedResource, terms: Sequence[str]) -> list[dict[str, Any]]:
        """Return the resource's chunks that contain a query term, best first, with scores."""
        wanted = set(terms)
        if not wanted or not doc.chunks:
            return []
        avg = self._chunk_tokens / self._chunk_count if self._chunk_count else 1.0
        scored: list[tuple[float, int, dict[str, Any]]] = []
        for position, chunk in enumerate(doc.chunks):
            tokens = tokenize(_str(chunk.get("text")))
            counts = Counter(t for t in tokens if t in wanted)
            if not counts:
                continue
            raw = 0.0
            for term, tf in counts.items():
                norm = _K1 * (1.0 - _B + _B * len(tokens) / (avg or 1.0))
                raw += self._idf(term) * tf * (_K1 + 1.0) / (tf + norm)
            scored.append((raw / (raw + 1.0), position, chunk))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [
            {**chunk, "score": round(score, 6)} for score, _, chunk in scored[:MAX_CHUNKS_PER_HIT]
        ]

    # ----------------------------------------------------------------- ranking

    def _element_scores(
        self, spec: QuerySpec, use_numpy: bool
    ) -> tuple[list[int], list[float]] | None:
        """Return (rows, scores) of the element's hits above its cut-off; None means browse."""
        signals: list[Any] = []
        n = len(self.docs)
        if spec.text is not None:
            terms = tokenize(spec.text)
            vector = self.small3.similarities(SMALL3.counts(terms), use_numpy)
            keyword = self.keyword_scores(terms)
            if use_numpy:
                vec = np.asarray(vector, dtype=np.float64)
                combined = _VECTOR_WEIGHT * vec
                if keyword:
                    rows = np.fromiter(keyword.keys(), dtype=np.intp, count=len(keyword))
                    kvals = np.fromiter(keyword.values(), dtype=np.float64, count=len(keyword))
                    # The same two products and one sum per row as the pure-Python branch.
                    combined[rows] = _KEYWORD_WEIGHT * kvals + _VECTOR_WEIGHT * vec[rows]
                signals.append(combined)
            else:
                signals.append(
                    [
                        _KEYWORD_WEIGHT * keyword.get(row, 0.0) + _VECTOR_WEIGHT * vector[row]
                        for row in range(n)
                    ]
                )
        if spec.image is not None:
            query = spec.image.vector
            signal = _as_signal(self.clip2.similarities(query, use_numpy), use_numpy)
            if self.images:
                # Pictures are compared in pure Python on both paths, so the scores match.
                wanted = spec.image.fingerprint
                for row, stored in self.images.items():
                    alike = similarity(wanted, stored)
                    if alike > signal[row]:
                        signal[row] = alike
            signals.append(signal)
        excluded: int | None = None
        if spec.resource_id is not None:
            target = self.by_id.get(spec.resource_id)
            if target is None:
                raise not_found(f"no resource {spec.resource_id} in this base", field="resourceId")
            excluded = target.row
            query = self.small3.row(target.row)
            signals.append(_as_signal(self.small3.similarities(query, use_numpy), use_numpy))
        if not signals:
            return None
        threshold = cutoff(spec.precision)
        if use_numpy:
            total = signals[0]
            for signal in signals[1:]:
                total = total + signal
            if len(signals) > 1:
                total = total / len(signals)
            if excluded is not None:
                total[excluded] = 0.0
            rows_np = np.nonzero((total > 0.0) & (total >= threshold))[0]
            return rows_np.tolist(), total[rows_np].tolist()
        out_rows: list[int] = []
        out_scores: list[float] = []
        count = len(signals)
        for row in range(n):
            score = signals[0][row]
            for signal in signals[1:]:
                score = score + signal[row]
            if count > 1:
                score = score / count
            if row == excluded:
                continue
            if score > 0.0 and score >= threshold:
                out_rows.append(row)
                out_scores.append(score)
        return out_rows, out_scores

    def search(
        self, request: SearchRequest, *, use_numpy: bool | None = None
    ) -> tuple[int, list[tuple[IndexedResource, float, tuple[str, ...]]]]:
        """Return the total number of hits and the requested page as (doc, score, terms)."""
        if use_numpy is None:
            use_numpy = HAVE_NUMPY
        elif use_numpy and not HAVE_NUMPY:
            raise RuntimeError("numpy is not installed; search with use_numpy=False")
        key = (
            request.elements,
            request.filters,
            request.sort_field,
            request.sort_order,
            use_numpy,
            len(self.docs),
        )
        last_key, ordered, best = self._last_search
        if last_key != key:
            ordered, best = self._ordered(request, use_numpy)
            self._last_search = (key, ordered, best)
        start = request.page_index * request.page_size
        page = ordered[start : start + request.page_size]
        return len(ordered), [(self.docs[row], best[row][0], best[row][1]) for row in page]

    def _ordered(
        self, request: SearchRequest, use_numpy: bool
    ) -> tuple[list[int], dict[int, tuple[float, tuple[str, ...]]]]:
        """Every hit of a search in order, and each hit's score and matched terms."""
        best: dict[int, tuple[float, tuple[str, ...]]] = {}
        has_query = False
        for spec in request.elements:
            terms = tuple(tokenize(spec.text)) if spec.text is not None else ()
            found = self._element_scores(spec, use_numpy)
            if found is None:
                candidates: Iterable[tuple[int, float]] = ((d.row, 1.0) for d in self.docs)
            else:
                has_query = True
                candidates = zip(*found, strict=True)
            for row, score in candidates:
                doc = self.docs[row]
                if not (request.filters.matches(doc) and spec.filters.matches(doc)):
                    continue
                previous = best.get(row)
                if previous is None or score > previous[0]:
                    best[row] = (score, terms)
        return self._sort(best, request, has_query), best

    def _sort(
        self,
        hits: dict[int, tuple[float, tuple[str, ...]]],
        request: SearchRequest,
        has_query: bool,
    ) -> list[int]:
        # No sort given: by relevance when there is a query, newest first when browsing.
        field_name = request.sort_field or ("score" if has_query else "createdAt")
        order = request.sort_order or SORT_FIELDS[field_name]
        rows = sorted(hits, key=lambda r: self.docs[r].id)  # ties: by id, ascending
        keyed: list[tuple[Any, int]] = []
        missing: list[int] = []
        for row in rows:
            doc = self.docs[row]
            value: Any
            if field_name == "score":
                value = hits[row][0]
            elif field_name == "createdAt":
                value = doc.created
            elif field_name == "modifiedAt":
                value = doc.modified
            elif field_name == "name":
                value = doc.name.casefold() if doc.name is not None else None
            else:
                value = doc.size
            if value is None:
                missing.append(row)
            else:
                keyed.append((value, row))
        # list.sort stays stable with reverse=True, so equal values keep the id order.
        keyed.sort(key=lambda item: item[0], reverse=order == "desc")
        return [row for _, row in keyed] + missing


def _as_signal(values: Sequence[float] | npt.NDArray[np.float64], use_numpy: bool) -> Any:
    return np.asarray(values, dtype=np.float64) if use_numpy else values
