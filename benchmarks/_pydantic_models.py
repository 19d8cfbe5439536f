"""Pydantic v2 models of the same wire schema as ``asyncsearch._models``, for comparison.

The rules are the SDK's: camelCase wire names (``small3_512`` keeps its name), ``id`` and the
paging fields required, every other field defaulting to ``None`` (scalars and objects) or ``[]``
(arrays, where a ``null`` array also reads as ``[]``), unknown fields ignored, documented ISO 8601
timestamps as ``datetime`` and the others as ``str``, numbers the spec leaves untyped as
``int | float``. This is the shape a generated SDK (Stainless, openapi-generator) would have.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["ExtractionJobModel", "SearchPageModel"]

T = TypeVar("T")


def _null_to_empty(value: object) -> object:
    return [] if value is None else value


#: A list field where ``null`` reads as ``[]``, as in the SDK's models.
NullableList = Annotated[list[T], BeforeValidator(_null_to_empty)]
Number = int | float


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class User(_Wire):
    id: str
    name: str | None = None
    picture_url_cdn: str | None = None


class ImageDescriptor(_Wire):
    url: str | None = None
    width: Number | None = None
    height: Number | None = None
    mime: str | None = None


class FileLink(_Wire):
    url: str | None = None
    size: Number | None = None
    mime: str | None = None


class AnonymousIdentity(_Wire):
    display_name: str | None = None
    session_hash: str | None = None


class CommentPinned(_Wire):
    id: str
    content: str | None = None
    created_at: str | None = None
    modified_at: str | None = None
    resource_id: str | None = None
    anonymous_identity: AnonymousIdentity | None = None
    user: User | None = None
    mentioned_users: NullableList[User] = []


class Label(_Wire):
    id: int
    hex_color: str | None = None


class Parent(_Wire):
    id: str
    name: str | None = None


class Folder(_Wire):
    id: str
    name: str | None = None
    is_locked: bool | None = None
    is_password_protected: bool | None = None
    user: User | None = None


class Root(_Wire):
    id: str
    type: str | None = None
    subtype: str | None = None
    is_private: bool | None = None
    folder: Folder | None = None


class Tag(_Wire):
    id: str
    name: str | None = None


class Agent(_Wire):
    id: str


class Chat(_Wire):
    id: str
    name: str | None = None
    is_pinned: bool | None = None
    created_at: str | None = None
    modified_at: str | None = None
    agent: Agent | None = None


class Thumbnail(_Wire):
    sm: str | None = None
    md: str | None = None
    lg: str | None = None
    xl: str | None = None
    original: str | None = None


class PublishedAncestor(_Wire):
    resource_id: str | None = None
    access_token: str | None = None


class DocumentAttributes(_Wire):
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
    width: Number | None = None
    height: Number | None = None


class ResourceAttributes(_Wire):
    document: DocumentAttributes | None = None
    dimensions: Size | None = None
    cover: ImageDescriptor | None = None


class DocumentPreview(_Wire):
    html: str | None = None


class PdfRender(_Wire):
    storage_path: str | None = None
    url: str | None = None


class ResourceData(_Wire):
    infected: bool | None = None
    document_preview: DocumentPreview | None = None
    caption: str | None = None
    keywords: NullableList[str] = []
    attributes: ResourceAttributes | None = None
    pdf_render: PdfRender | None = None


class SearchChunk(_Wire):
    text: str | None = None
    sequence: int | None = None
    page_number: int | None = None
    time_start: float | None = None
    time_end: float | None = None
    score: float | None = None


class Embeddings(_Wire):
    small3_512: NullableList[float] = Field(default_factory=list, alias="small3_512")
    clip2: NullableList[float] = []


class SearchHit(_Wire):
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
    tags: NullableList[Tag] = []
    chats: NullableList[Chat] = []
    thumbnail: Thumbnail | None = None
    file_url: str | None = None
    preferences: Any = None
    is_password_protected: bool | None = None
    is_locked: bool | None = None
    published_ancestors: NullableList[PublishedAncestor] = []
    created_at: str | None = None
    modified_at: str | None = None
    data: ResourceData | None = None
    score: float | None = None
    chunks: NullableList[SearchChunk] = []
    embeddings: Embeddings | None = None


class SearchPageModel(_Wire):
    total: int
    has_more: bool
    hits: NullableList[SearchHit] = []


class ExtractionCommon(_Wire):
    mime_type: str | None = None
    size: Number | None = None
    infected: bool | None = None
    caption: str | None = None
    keywords: NullableList[str] = []
    thumbnail: str | None = None
    chunk_count: int | None = None


class MediaColor(_Wire):
    profile: str | None = None
    space: str | None = None
    alpha_channel: bool | None = None
    pixel_format: str | None = None


class MediaLocation(_Wire):
    latitude: float | None = None
    longitude: float | None = None


class MediaDevice(_Wire):
    maker: str | None = None
    model: str | None = None
    software: str | None = None


class DominantColor(_Wire):
    rgb: NullableList[int] = []
    score: float | None = None


class ExtractionMedia(_Wire):
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
    dominant_colors: NullableList[DominantColor] = []
    ocr: str | None = None
    screenshot: ImageDescriptor | None = None
    transcript: FileLink | None = None


class ExtractionDocument(_Wire):
    pages: int | None = None
    author: str | None = None
    title: str | None = None
    subject: str | None = None
    creator: str | None = None
    producer: str | None = None
    version: str | None = None
    security: bool | None = None
    creation_date: datetime.datetime | None = None
    modification_date: datetime.datetime | None = None
    pdf_render: FileLink | None = None
    document_type: str | None = None
    structured: Any = None


class ExtractionWeb(_Wire):
    title: str | None = None
    site_name: str | None = None
    description: str | None = None
    url: str | None = None
    image: ImageDescriptor | None = None
    favicon: ImageDescriptor | None = None
    html: FileLink | None = None
    reader: FileLink | None = None


class Extraction(_Wire):
    common: ExtractionCommon | None = None
    media: ExtractionMedia | None = None
    document: ExtractionDocument | None = None
    web: ExtractionWeb | None = None


class JobLinks(_Wire):
    chunks: str | None = None
    download: str | None = None


class ExtractionJobModel(_Wire):
    id: str
    workspace_id: str | None = None
    user_id: str | None = None
    kind: str | None = None
    name: str | None = None
    url: str | None = None
    state: str | None = None
    created_at: datetime.datetime | None = None
    extraction: Extraction | None = None
    links: JobLinks | None = None
