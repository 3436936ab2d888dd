"""The one record type every annotation reader produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MediaKind = Literal["image", "video"]


@dataclass(frozen=True)
class CaptionRecord:
    """One image or video with its reference captions.

    item_id:   unique string key (FeatureStore key, vocabulary-independent).
    source_id: the id as the dataset writes it (COCO ``image_id`` int, MSR-VTT ``video7``);
               this is what results files carry.
    path:      media file path relative to the dataset's media root.
    captions:  raw reference captions (untokenized).
    split:     ``train`` | ``val`` | ``test`` (Karpathy ``restval`` is mapped to train by readers
               unless configured otherwise).
    kind:      ``image`` | ``video``.
    """

    item_id: str
    source_id: int | str
    path: str
    captions: tuple[str, ...]
    split: str
    kind: MediaKind = "image"
    extra: dict = field(default_factory=dict, compare=False, hash=False)
