"""The caption table (captioning.data.caption_table): its arrays against hand-computed values, the file
round trip, a changed input rebuilding it, a corrupt file refused, the build in a child process; and
that the vocabulary, token ids, references and training batches are those of the records' own path
(``build_vocabulary``, ``tokenize``, ``Vocabulary.encode``) on the embedded fixtures."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_image_dataset

from captioning.config import DataConfig
from captioning.data.annotations import read_dataset
from captioning.data.caption_table import CaptionTable, caption_table, open_table, table_path
from captioning.data.datamodule import CaptionDataModule, CaptionTrainDataset, collate
from captioning.data.records import CaptionRecord
from captioning.data.tokenizer import tokenize
from captioning.data.vocab import BOS, EOS, SPECIALS, UNK, build_vocabulary
from captioning.errors import DataError
from captioning.store.feature_store import FeatureStore

FIX = Path(__file__).parent / "fixtures" / "annotations"
RECORDS = [
    CaptionRecord("a", 1, "a.jpg", ("A dog.", "a big dog"), "train", extra={"imgid": 0}),
    CaptionRecord("b", "vid2", "b.jpg", ("Two cats",), "val"),
    CaptionRecord("c", 3, "c.jpg", ("a cat", "..."), "test"),  # "..." is no token at all
]


def _cfg(root: Path, ann: Path, on_error: str = "skip") -> DataConfig:
    return DataConfig(name="t", kind="image", format="karpathy", root=str(root), media_dir=str(root / "media"),
                      annotations={"all": str(ann)}, on_error=on_error)


def test_arrays_by_hand_and_the_file_round_trip(tmp_path: Path) -> None:
    t = CaptionTable.from_records(RECORDS)
    # lexicon in order of first appearance: a dog big two cats cat
    assert t.words == ["a", "dog", "big", "two", "cats", "cat"]
    assert t.tokens.tolist() == [0, 1, 0, 2, 1, 3, 4, 0, 5]
    assert t.caption_offsets.tolist() == [0, 2, 5, 7, 9, 9]  # 5 captions, the last one empty
    assert t.item_offsets.tolist() == [0, 2, 3, 5]
    assert t.split.tolist() == [0, 1, 2] and t.train_counts.tolist() == [2, 2, 1, 0, 0, 0]
    assert t.rows("val").tolist() == [1] and t.references(2) == ["a cat", ""]
    v = t.vocabulary(min_count=1)
    assert v.itos == [*SPECIALS, "a", "dog", "big"]  # count 2, 2 (a before dog), 1
    assert t.vocabulary(min_count=2).itos == [*SPECIALS, "a", "dog"]
    enc = t.encoder(v)
    assert enc.tolist() == [4, 5, 6, UNK, UNK, UNK]
    assert t.encode(1, enc, max_length=2).tolist() == [BOS, 4, 6, EOS]  # "a big" of "a big dog"
    assert t.encode(4, enc, max_length=20).tolist() == [BOS, EOS]

    saved = open_table(t.save(tmp_path / "t.captions"))
    assert set(saved.arrays) == set(t.arrays)
    for name, a in t.arrays.items():
        np.testing.assert_array_equal(saved.arrays[name], a)
        assert saved.arrays[name].dtype == a.dtype and not saved.arrays[name].flags.writeable  # mapped
    for i, r in enumerate(RECORDS):
        assert saved.record(i) == r and saved.record(i).extra == r.extra
    again = pickle.loads(pickle.dumps(saved))  # a worker started by spawn gets the path, maps it again
    assert again.path == saved.path and again.references(0) == ["a dog", "a big dog"]
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("fmt, ann", [
    ("karpathy", {"all": "dataset_coco.json"}), ("karpathy", {"all": "dataset_flickr8k.json"}),
    ("coco", {"train": "captions_train.json", "val": "captions_val.json"}),
    ("msvd", {"all": "AllVideoDescriptions.txt"}),
    ("msrvtt", {"train": "train_val_videodatainfo.json", "test": "test_videodatainfo.json"}),
])
def test_the_records_path_and_the_table_agree_on_the_fixtures(tmp_path: Path, fmt: str, ann: dict) -> None:
    cfg = _cfg(tmp_path, FIX / "x")
    cfg.format, cfg.kind = fmt, "image" if fmt in ("coco", "karpathy") else "video"
    cfg.annotations = {k: str(FIX / f) for k, f in ann.items()}
    records = read_dataset(cfg).records
    table = caption_table(cfg)
    assert table.path is not None and table.path.parent == tmp_path / "caption_tables"
    assert len(table) == len(records) and [table.record(i) for i in range(len(table))] == records
    for min_count in (1, 2):
        if any(r.split == "train" for r in records):
            old = build_vocabulary(records, min_count=min_count)
            assert table.vocabulary(min_count=min_count) == old
    vocab = build_vocabulary([CaptionRecord(r.item_id, r.source_id, r.path, r.captions, "train") for r in records])
    enc = table.encoder(vocab)
    k = 0
    for i, r in enumerate(records):
        refs = [" ".join(tokenize(c)) for c in r.captions]
        assert table.references(i) == refs
        for ref in refs:
            for length in (3, 20):
                assert table.encode(k, enc, length).tolist() == [BOS, *vocab.encode(ref.split(), length), EOS]
            k += 1
    assert k == len(table.caption_offsets) - 1


def _old_samples(items, vocab, max_length: int) -> tuple[list[int], list[list[int]]]:
    """The training samples as the records' path made them: (item, <bos> ids <eos>) per reference."""
    item, tokens = [], []
    for i, refs in enumerate([[" ".join(tokenize(c)) for c in r.captions] for r in items.records]):
        for ref in refs:
            item.append(i)
            tokens.append([vocab.bos, *vocab.encode(ref.split(), max_length), vocab.eos])
    return item, tokens


def test_training_batches_are_those_of_the_records_path(tmp_path: Path) -> None:
    data = make_tiny_image_dataset(tmp_path / "tiny", n=24)
    root = data["root"]
    cfg = DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                     annotations={s: str(root / "annotations" / f"captions_{s}.json") for s in ("train", "val", "test")})
    dataset = read_dataset(cfg)
    vocab = build_vocabulary(dataset.split("train"))
    table = caption_table(cfg)
    assert table.vocabulary() == vocab
    store = FeatureStore.open(data["features_dir"])
    dm = CaptionDataModule(table, store, vocab, max_length=3, batch_size=5, num_workers=0, batching="caption")
    for split in ("train", "val", "test"):
        items = dm.items[split]
        assert items.records == dataset.split(split)
        assert list(items.references) == [[" ".join(tokenize(c)) for c in r.captions] for r in dataset.split(split)]
    train = dm.train_dataloader().dataset
    assert isinstance(train, CaptionTrainDataset)
    old_item, old_tokens = _old_samples(dm.items["train"], vocab, 3)
    assert train.item.tolist() == old_item and [train.caption(k).tolist() for k in range(len(train))] == old_tokens
    torch.manual_seed(0)
    order = torch.randperm(len(train)).tolist()
    for start in range(0, len(order), 5):
        ks = order[start:start + 5]
        old = collate([(torch.from_numpy(store.read(str(train.items.ids[old_item[k]])).features),
                        store.read(str(train.items.ids[old_item[k]])).valid, torch.tensor(old_tokens[k]), old_item[k])
                       for k in ks])
        new = train.__getitems__(ks)
        for a, b in ((old.features, new.features), (old.mask, new.mask), (old.tokens, new.tokens),
                     (old.index, new.index)):
            assert torch.equal(a, b)


def test_a_changed_annotation_file_is_a_new_table(tmp_path: Path) -> None:
    ann = tmp_path / "dataset_coco.json"
    shutil.copy(FIX / "dataset_coco.json", ann)
    cfg = _cfg(tmp_path, ann)
    first = caption_table(cfg)
    shutil.copy(FIX / "dataset_coco.json", ann)  # the same bytes again: the same table
    assert table_path(cfg) == first.path
    data = json.loads(ann.read_text())
    data["images"][0]["sentences"][0]["raw"] = "A zebra."
    ann.write_text(json.dumps(data))
    second = caption_table(cfg)
    assert second.path != first.path and first.path.is_file()
    assert second.references(0)[0] == "a zebra" and first.references(0)[0] != "a zebra"
    assert table_path(_cfg(tmp_path, ann, on_error="raise")) != second.path  # the reader's settings count too


def test_a_corrupt_table_is_an_error_naming_it(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, FIX / "dataset_coco.json")
    path = caption_table(cfg).path
    good = path.read_bytes()
    for bad, why in ((good[:-8], "bytes, the header says"), (good[:-1] + bytes([good[-1] ^ 1]), "checksum mismatch"),
                     (b"{}" + good[2:], "no caption table header")):
        path.write_bytes(bad)
        with pytest.raises(DataError, match=f"caption table {path} is corrupt .*{why}.*delete it"):
            caption_table(cfg)  # never rebuilt over silently, never read
    path.write_bytes(good)
    restored = caption_table(cfg)
    assert restored.path == path
    assert restored.references(0) == [" ".join(tokenize(c)) for c in read_dataset(cfg).records[0].captions]


def test_the_build_in_a_child_process(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, FIX / "dataset_flickr8k.json")
    table = caption_table(cfg, isolate=True)
    assert [table.record(i) for i in range(len(table))] == read_dataset(cfg).records
    (tmp_path / "bad.json").write_text(json.dumps({"no images": []}))
    with pytest.raises(DataError, match="has no 'images' list"):  # the child's error, as it is
        caption_table(_cfg(tmp_path, tmp_path / "bad.json"), isolate=True)


def test_sha256_of_files_and_of_the_rest_of_an_open_file(tmp_path) -> None:
    """FIPS 180-2's example: sha256("abc"); what a table's checksum and a provenance record use."""
    from captioning.utils.io import file_sha256, stream_sha256

    abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    path = tmp_path / "f"
    path.write_bytes(b"xxabc")
    with open(path, "rb") as f:
        f.seek(2)
        assert stream_sha256(f) == abc
    path.write_bytes(b"abc")
    assert file_sha256(path) == abc


def test_a_table_without_train_captions_has_no_vocabulary() -> None:
    """The same one-line error as ``build_vocabulary`` of the same records."""
    table = CaptionTable.from_records(RECORDS[1:])  # val and test only
    with pytest.raises(DataError, match="no training captions to build the vocabulary from: the train split is empty"):
        table.vocabulary()
    assert CaptionTable.from_records(RECORDS).vocabulary().stoi["dog"] >= 4
