"""The training and evaluation input path: FeatureStore.read (one pread per item, nothing mapped),
whole batches read by the datasets' ``__getitems__`` (equal to ``collate`` of per-sample reads, in
DataLoader workers too), the flat caption arrays of the training dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from captioning.data.datamodule import (
    Batch,
    CaptionEvalDataset,
    CaptionsPerItemDataset,
    CaptionTrainDataset,
    FeatureItems,
    collate,
    pad_tokens,
)
from captioning.data.records import CaptionRecord
from captioning.data.vocab import Vocabulary
from captioning.errors import DataError
from captioning.store.feature_store import FeatureStore
from captioning.store.streams import open_features
from captioning.store.writer import FeatureStoreWriter

N, C = 6, 8


def _features(i: int) -> np.ndarray:
    return (np.arange(N * C, dtype=np.float32).reshape(N, C) / 16 + i).astype(np.float16)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """13 items over 4 shards of 4 (the last one short); item i has valid = 1 + i % N."""
    meta = {"settings": {"t": 1}, "kind": "image", "positions": N, "dim": C, "grid": [2, 3], "dtype": "float16"}
    with FeatureStoreWriter(tmp_path / "store", meta, shard_size=4) as w:
        for i in range(13):
            w.add(f"id{i}", _features(i), valid=1 + i % N)
    return tmp_path / "store"


def _records(n: int = 13) -> list[CaptionRecord]:
    caps = ["a red circle", "a blue square on the left", "red", "a circle and a square and a triangle here"]
    return [CaptionRecord(f"id{i}", i, f"{i}.jpg", tuple(caps[(i + k) % 4] for k in range(1 + i % 3)), "train")
            for i in range(n)]


def _vocab() -> Vocabulary:
    return Vocabulary.build([c.split() for r in _records() for c in r.captions])


def _equal(a: Batch, b: Batch) -> None:
    assert torch.equal(a.features, b.features) and torch.equal(a.mask, b.mask) and torch.equal(a.index, b.index)
    assert (a.tokens is None) == (b.tokens is None)
    if a.tokens is not None:
        assert torch.equal(a.tokens, b.tokens)


def _mapped(store: Path) -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if str(store.resolve()) in line]


def test_read_is_one_new_array_equal_to_the_mapped_row(store: Path) -> None:
    s = FeatureStore.open(store)
    reads = [s.read(f"id{i}") for i in range(13)]
    assert _mapped(store) == []  # pread: no shard stays memory-mapped
    for i in (0, 5, 12):
        np.testing.assert_array_equal(reads[i].features, _features(i))
        item = s.read(f"id{i}")
        assert item.features.flags.writeable and not isinstance(item.features, np.memmap)
        np.testing.assert_array_equal(item.features, _features(i))
        assert (item.valid, item.grid, item.frame_indices) == (s[f"id{i}"].valid, (2, 3), None)
    out = np.zeros((N, C), dtype=np.float16)
    assert s.read("id7", out=out).features is out
    np.testing.assert_array_equal(out, _features(7))
    with pytest.raises(ValueError, match=r"float16 \[6, 8\]"):
        s.read("id7", out=np.zeros((N, C), dtype=np.float32))
    with pytest.raises(KeyError, match="id99"):
        s.read("id99")


def test_read_refuses_a_truncated_shard_naming_it(store: Path) -> None:
    s = FeatureStore.open(store)
    shard = sorted((store / "shards").glob("*.npy"))[1]  # items 4..7
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataError, match=shard.name):
        s.read("id7")


def test_streams_read_like_their_items(tmp_path: Path, store: Path) -> None:
    meta = {"settings": {"t": 2}, "kind": "image", "positions": N, "dim": 3, "grid": [2, 3], "dtype": "float32"}
    with FeatureStoreWriter(tmp_path / "other", meta, shard_size=5) as w:
        for i in range(13):
            w.add(f"id{i}", np.full((N, 3), i, dtype=np.float32), valid=1 + i % N)
    streams = open_features([store, tmp_path / "other"])
    out = np.zeros((N, C + 3), dtype=np.float32)
    item = streams.read("id3", out=out)
    assert item.features is out and item.valid == 4
    np.testing.assert_array_equal(out, streams["id3"].features)


def test_batches_read_whole_equal_collate_of_samples(store: Path) -> None:
    items = FeatureItems(_records(), FeatureStore.open(store))
    vocab = _vocab()
    ks = [11, 2, 7, 0, 5]
    train = CaptionTrainDataset(items, vocab, max_length=5)
    assert len(train) == sum(len(r.captions) for r in _records())
    _equal(train.__getitems__(ks), collate([train[k] for k in ks]))
    evaluation = CaptionEvalDataset(items)
    _equal(evaluation.__getitems__([3, 1, 12]), collate([evaluation[i] for i in (3, 1, 12)]))
    per_item = CaptionsPerItemDataset(items, vocab, max_length=5, k=1)
    torch.manual_seed(3)
    whole = per_item.__getitems__([4, 8, 2, 9])
    torch.manual_seed(3)
    _equal(whole, collate([per_item[i] for i in (4, 8, 2, 9)]))
    batch = train.__getitems__(ks)  # longest caption first, as the packed loss needs
    lengths = (batch.tokens != vocab.pad).sum(1).tolist()
    assert lengths == sorted(lengths, reverse=True)
    assert batch.mask.sum(1).tolist() == [1 + i % N for i in batch.index.tolist()]


def test_train_samples_are_flat_arrays(store: Path) -> None:
    items = FeatureItems(_records(3), FeatureStore.open(store))
    vocab = _vocab()
    ds = CaptionTrainDataset(items, vocab, max_length=3)
    # item 0: "a red circle"; item 1: "a blue square on the left" (cut to 3 words), "red"; item 2: three captions
    assert ds.item.tolist() == [0, 1, 1, 2, 2, 2]
    assert vocab.decode(ds.caption(1)[1:]) == ["a", "blue", "square"]
    assert ds.caption(2).tolist() == [vocab.bos, vocab.stoi["red"], vocab.eos]
    assert ds.caption_index.tolist() == [0, 1, 2, 3, 4, 5] and ds.caption(0).dtype == np.int32
    assert pad_tokens([[1, 2], np.array([3], dtype=np.int32)], pad=0).tolist() == [[1, 2], [3, 0]]


def test_worker_batches_are_the_items_in_shared_memory(store: Path) -> None:
    items = FeatureItems(_records(), FeatureStore.open(store))
    ds = CaptionTrainDataset(items, _vocab(), max_length=5)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=collate)
    seen = 0
    for batch in loader:
        for row, i in enumerate(batch.index.tolist()):
            np.testing.assert_array_equal(batch.features[row].numpy(), _features(i))
        seen += len(batch.index)
    assert seen == len(ds)


def test_a_workers_batch_is_allocated_in_shared_memory(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = FeatureItems(_records(), FeatureStore.open(store))
    assert not items.batch([0, 1])[0].is_shared()  # the main process keeps it
    monkeypatch.setattr("captioning.data.batches.get_worker_info", lambda: object())  # as inside a worker
    feats, _, _ = items.batch([0, 1])
    assert feats.is_shared()  # sent to the main process as it is, not copied into shared memory first
    np.testing.assert_array_equal(feats[1].numpy(), _features(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_pin_memory_pins_every_tensor(store: Path) -> None:
    items = FeatureItems(_records(), FeatureStore.open(store))
    batch = CaptionTrainDataset(items, _vocab(), max_length=5).__getitems__([0, 1]).pin_memory()
    assert all(t.is_pinned() for t in (batch.features, batch.mask, batch.tokens, batch.index))



@pytest.mark.parametrize("batching", ["image", "caption"])
def test_the_device_cache_gives_the_loaders_batches_in_the_same_order(store: Path, batching: str) -> None:
    """``data.cache=device`` with the CPU as the device: the loader reads captions only and the cache
    gathers each batch's features and mask (``on_after_batch_transfer``); for the same seed the
    batches are the store-reading loader's, in the same order, over two epochs."""
    from captioning.data.datamodule import CaptionDataModule

    records = _records()
    modules = {c: CaptionDataModule({"train": records, "val": records[:3]}, FeatureStore.open(store), _vocab(),
                                    max_length=5, batch_size=4, num_workers=0, batching=batching, cache=c, seed=3)
               for c in ("none", "device")}
    cached = modules["device"]
    epochs = {}
    for setting, dm in modules.items():
        loader = dm.train_dataloader()
        batches = []
        for epoch in range(2):
            loader.dataset.set_epoch(epoch) if hasattr(loader.dataset, "set_epoch") else None
            torch.manual_seed(epoch)
            batches += [dm.on_after_batch_transfer(b, 0) for b in loader]
        epochs[setting] = batches
    assert cached.cache is not None and modules["none"].cache is None
    assert cached.cache.features.shape == (13, N, C) and cached.cache.features.dtype == torch.float16
    assert all(b.features is None for b in cached.train_dataloader())  # the loader reads no features
    assert len(epochs["device"]) == len(epochs["none"]) > 4
    for a, b in zip(epochs["device"], epochs["none"], strict=True):
        _equal(a, b)
        assert torch.equal(a.lengths, b.lengths) and a.full == b.full
