"""A COCO-sized dataset without the data: random fp16 feature grids and COCO-like captions.

Features: ``items`` grids of [H*W, C] standard-normal values, written in fp16 through the real
``FeatureStoreWriter`` in shards of 256 items, as extraction writes them.

Captions (Karpathy's ``dataset_coco.json`` layout, ``restval`` folded into ``train``): words drawn
from a Zipf law over a ``vocab``-word vocabulary, ``P(rank r) = 1 / (r H_V)`` (so the most frequent
word is ~10x as frequent as the 10th), lengths drawn from ``COCO_LENGTHS``.  The splits are a
seeded permutation, so any prefix of the store holds val and test items in proportion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from captioning.config import DataConfig
from captioning.store.writer import FeatureStoreWriter
from captioning.utils.io import atomic_write

SHARD_SIZE = 256  # extraction's default (conf/extract.yaml)
# Words per caption, approximately COCO's (Karpathy train: mean ~10.5 words, 8-13 words for ~85%).
COCO_LENGTHS = {6: 0.005, 7: 0.02, 8: 0.14, 9: 0.24, 10: 0.21, 11: 0.14, 12: 0.09, 13: 0.055, 14: 0.035,
                15: 0.02, 16: 0.015, 17: 0.01, 18: 0.007, 19: 0.005, 20: 0.003, 22: 0.005}


def item_id(i: int) -> str:
    """The store key of synthetic item ``i`` (also its cocoid)."""
    return str(i + 1)


def data_config(annotations: Path, min_count: int = 5) -> DataConfig:
    """The ``data`` config of a synthetic split file: Karpathy format, ``min_count`` as conf/data/coco.yaml."""
    root = str(Path(annotations).parent)
    return DataConfig(name="synthetic_coco", kind="image", format="karpathy", root=root, media_dir=root,
                      annotations={"all": str(annotations)}, min_count=min_count)


def split_of(items: int, eval_items: int, seed: int = 0) -> np.ndarray:
    """[items] array of 0 (train) / 1 (val) / 2 (test): ``eval_items`` val and as many test items,
    spread by a seeded permutation."""
    labels = np.zeros(items, dtype=np.int8)
    labels[:eval_items] = 1
    labels[eval_items: 2 * eval_items] = 2
    return np.random.default_rng(seed).permutation(labels)


def word(rank: int) -> str:
    """A lower-case letters-only word for vocabulary rank ``rank`` (bijective base 26, prefix ``w``)."""
    letters = []
    n = rank + 1
    while n:
        n, r = divmod(n - 1, 26)
        letters.append(chr(ord("a") + r))
    return "w" + "".join(reversed(letters))


def zipf_probabilities(vocab: int, exponent: float = 1.0) -> np.ndarray:
    """[vocab] probabilities of ranks 1..vocab under ``P(r) ~ r^-exponent``."""
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    return p / p.sum()


def draw_captions(n: int, vocab: int, seed: int) -> tuple[list[list[str]], np.ndarray]:
    """``n`` captions (lists of words): lengths from ``COCO_LENGTHS``, words from the Zipf law;
    and [vocab] how often each rank was drawn."""
    rng = np.random.default_rng(seed)
    lengths_table = np.array(list(COCO_LENGTHS), dtype=np.int64)
    probs = np.array(list(COCO_LENGTHS.values()))
    lengths = rng.choice(lengths_table, size=n, p=probs / probs.sum())
    ranks = rng.choice(vocab, size=int(lengths.sum()), p=zipf_probabilities(vocab))
    words = [word(r) for r in range(vocab)]
    out, start = [], 0
    for length in lengths.tolist():
        out.append([words[r] for r in ranks[start: start + length]])
        start += length
    return out, np.bincount(ranks, minlength=vocab)


def write_annotations(path: Path, items: int, eval_items: int, captions_per_item: int, vocab: int,
                      seed: int = 0) -> dict[str, Any]:
    """Write a Karpathy-layout split file for items ``0..items-1``; returns its counts."""
    splits = split_of(items, eval_items, seed)
    names = np.array(["train", "val", "test"])[splits]
    captions, counts = draw_captions(items * captions_per_item, vocab, seed + 1)
    images = []
    for i in range(items):
        cocoid = int(item_id(i))
        sents = [{"tokens": c, "raw": " ".join(c) + ".", "imgid": i, "sentid": i * captions_per_item + k}
                 for k, c in enumerate(captions[i * captions_per_item: (i + 1) * captions_per_item])]
        images.append({"filepath": "synthetic", "filename": f"{cocoid:012d}.jpg", "imgid": i, "cocoid": cocoid,
                       "split": str(names[i]), "sentences": sents, "sentids": [s["sentid"] for s in sents]})
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps({"images": images, "dataset": "coco"})))
    lengths = np.array([len(c) for c in captions])
    return {"items": items, "captions": len(captions), "words": int(lengths.sum()),
            "mean_length": round(float(lengths.mean()), 2), "min_length": int(lengths.min()),
            "max_length": int(lengths.max()), "distinct_words": int((counts > 0).sum()),
            "top1_over_top10": round(float(counts[0] / max(1, counts[9])), 2) if vocab >= 10 else None,
            "train": int((splits == 0).sum()), "val": int((splits == 1).sum()),
            "test": int((splits == 2).sum()), "bytes": path.stat().st_size}


def random_shards(items: int, positions: int, dim: int, seed: int) -> Iterator[np.ndarray]:
    """Blocks of up to ``SHARD_SIZE`` items' features: [n, positions, dim] float16, N(0, 1)."""
    rng = np.random.default_rng(seed)
    for start in range(0, items, SHARD_SIZE):
        n = min(SHARD_SIZE, items - start)
        yield rng.standard_normal((n, positions, dim), dtype=np.float32).astype(np.float16)


def write_store(root: Path, items: int, grid: int, dim: int, seed: int = 0) -> dict[str, Any]:
    """Write ``items`` random [grid*grid, dim] fp16 items through ``FeatureStoreWriter``.

    Returns the bytes written (shard data files, index files), the seconds of the whole build (from
    the first draw to the end of ``close``) and those spent drawing the random numbers (the writer's
    thread writes meanwhile).
    """
    meta = {"settings": {"backbone": "synthetic-random", "weights": "none", "seed": seed}, "kind": "image",
            "positions": grid * grid, "dim": dim, "grid": [grid, grid], "dtype": "float16"}
    draw_s = 0.0
    start = time.perf_counter()
    with FeatureStoreWriter(root, meta, shard_size=SHARD_SIZE) as writer:
        first = 0
        t = time.perf_counter()
        for block in random_shards(items, grid * grid, dim, seed):
            draw_s += time.perf_counter() - t
            for k in range(block.shape[0]):
                writer.add(item_id(first + k), block[k], copy=False)  # each block is drawn anew
            first += block.shape[0]
            t = time.perf_counter()
    seconds = time.perf_counter() - start
    shards = root / "shards"
    data = sum(p.stat().st_size for p in shards.glob("*.npy"))
    index = sum(p.stat().st_size for p in shards.glob("*.index.json"))
    return {"items": items, "shards": len(list(shards.glob("*.npy"))), "data_bytes": data, "index_bytes": index,
            "seconds": seconds, "draw_s": draw_s}
