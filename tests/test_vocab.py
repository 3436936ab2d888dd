"""Vocabulary: specials, min-count, ordering, unk, truncation, decode, save/load validation, train-only build."""

from __future__ import annotations

import json
import sys
import types

import pytest

from captioning.data.records import CaptionRecord
from captioning.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary, build_vocabulary
from captioning.errors import CheckpointError, ConfigError, DataError

TOKENS = [
    ["a", "red", "circle"],
    ["a", "blue", "square"],
    ["a", "red", "square"],
    ["the", "red", "circle", "moves"],
]
# counts: a 3, red 3, circle 2, square 2, blue 1, the 1, moves 1


def test_specials_at_fixed_positions():
    v = Vocabulary.build(TOKENS)
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert v.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"] == list(SPECIALS)
    assert (v.pad, v.bos, v.eos, v.unk) == (0, 1, 2, 3)
    assert v.stoi["<unk>"] == 3


def test_order_by_count_then_alphabetical():
    v = Vocabulary.build(TOKENS)
    assert v.itos[4:] == ["a", "red", "circle", "square", "blue", "moves", "the"]
    assert len(v) == 11
    assert all(v.stoi[w] == i for i, w in enumerate(v.itos))


def test_min_count():
    v = Vocabulary.build(TOKENS, min_count=2)
    assert v.itos[4:] == ["a", "red", "circle", "square"]
    assert "blue" not in v and "red" in v
    assert Vocabulary.build(TOKENS, min_count=4).itos == list(SPECIALS)


def test_max_size_counts_specials():
    v = Vocabulary.build(TOKENS, max_size=6)
    assert v.itos == [*SPECIALS, "a", "red"]
    with pytest.raises(ConfigError, match="max_size"):
        Vocabulary.build(TOKENS, max_size=3)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_min_count(bad):
    with pytest.raises(ConfigError, match="data.min_count"):
        Vocabulary.build(TOKENS, min_count=bad)


def test_special_strings_in_data_are_not_duplicated():
    v = Vocabulary.build([["<unk>", "<eos>", "cat", "", " "]])
    assert v.itos == [*SPECIALS, "cat"]


def test_build_rejects_raw_strings():
    with pytest.raises(TypeError, match="tokenize"):
        Vocabulary.build(["a red circle"])


def test_encode_unk_and_truncation():
    v = Vocabulary.build(TOKENS, min_count=2)
    a, red, circle = v.stoi["a"], v.stoi["red"], v.stoi["circle"]
    assert v.encode(["a", "red", "circle"], 20) == [a, red, circle]
    assert v.encode(["a", "blue", "zebra", "circle"], 20) == [a, UNK, UNK, circle]
    assert v.encode(["a", "red", "circle"], 2) == [a, red]
    assert v.encode(["a", "red"], 0) == []
    assert v.encode(["a", "red"]) == [a, red]
    # special strings inside a caption are words, not control tokens
    assert v.encode(["<eos>", "<pad>", "<bos>", "<unk>"], 10) == [UNK] * 4
    with pytest.raises(ValueError):
        v.encode(["a"], -1)
    with pytest.raises(TypeError):
        v.encode("a red circle", 5)


def test_decode_stops_at_eos_and_drops_pad_bos():
    v = Vocabulary.build(TOKENS)
    ids = [BOS, v.stoi["a"], PAD, v.stoi["red"], UNK, EOS, v.stoi["circle"], PAD]
    assert v.decode(ids) == ["a", "red", "<unk>"]
    assert v.decode([]) == []
    assert v.decode([EOS, v.stoi["a"]]) == []
    with pytest.raises(ValueError, match="outside the vocabulary"):
        v.decode([len(v)])


def test_decode_accepts_numpy_and_torch_ints():
    np = pytest.importorskip("numpy")
    v = Vocabulary.build(TOKENS)
    assert v.decode(np.array([v.stoi["a"], v.stoi["red"], EOS])) == ["a", "red"]
    torch = pytest.importorskip("torch")
    assert v.decode(torch.tensor([v.stoi["circle"], EOS])) == ["circle"]


def test_encode_decode_roundtrip():
    v = Vocabulary.build(TOKENS)
    for tokens in TOKENS:
        assert v.decode([BOS, *v.encode(tokens, 20), EOS, PAD]) == tokens


def test_dict_roundtrip():
    v = Vocabulary.build(TOKENS, min_count=2)
    d = v.to_dict()
    assert d["itos"] == v.itos and d["min_count"] == 2
    json.dumps(d)  # plain data
    w = Vocabulary.from_dict(d)
    assert w == v and w.stoi == v.stoi and w.min_count == 2


def test_save_load_roundtrip(tmp_path):
    v = Vocabulary.build(TOKENS)
    path = v.save(tmp_path / "sub" / "vocab.json")
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp file left behind
    w = Vocabulary.load(path)
    assert w == v and w.itos == v.itos
    v2 = Vocabulary.build(TOKENS, min_count=2)
    v2.save(path)  # overwrite atomically
    assert Vocabulary.load(path) == v2


def test_build_is_deterministic():
    assert Vocabulary.build(TOKENS).itos == Vocabulary.build(list(reversed(TOKENS))).itos


@pytest.mark.parametrize("itos,problem", [
    (["<bos>", "<pad>", "<eos>", "<unk>", "a"], "first entries"),
    (["<pad>", "<bos>", "<eos>"], "first entries"),
    ([*SPECIALS, "a", "b", "a"], "duplicate word 'a'"),
    ([*SPECIALS, "a", "<unk>"], "duplicate word '<unk>'"),
    ([*SPECIALS, "a", 5], "entry 5 is not a non-empty string"),
    ([*SPECIALS, ""], "entry 4 is not a non-empty string"),
])
def test_invalid_dicts_are_refused(tmp_path, itos, problem):
    with pytest.raises(CheckpointError, match=problem):
        Vocabulary.from_dict({"version": 1, "itos": itos})
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"version": 1, "itos": itos}))
    with pytest.raises(DataError, match=rf"vocabulary file {path} is not a valid vocabulary: .*{problem}"):
        Vocabulary.load(path)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="vocabulary file not found: .*missing.json"):
        Vocabulary.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"itos": ["<pad>",')
    with pytest.raises(DataError, match=r"bad\.json is malformed JSON"):
        Vocabulary.load(bad)
    other = tmp_path / "other.json"
    other.write_text('["<pad>", "<bos>"]')
    with pytest.raises(DataError, match=r"other\.json is not a vocabulary"):
        Vocabulary.load(other)
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"version": 99, "itos": list(SPECIALS)}))
    with pytest.raises(DataError, match="format version 99"):
        Vocabulary.load(future)
    with pytest.raises(CheckpointError, match="checkpoint vocabulary is not a vocabulary"):
        Vocabulary.from_dict(None)


def _rec(item_id: str, split: str, *captions: str) -> CaptionRecord:
    return CaptionRecord(item_id, item_id, f"{item_id}.jpg", captions, split)


RECORDS = [
    _rec("1", "train", "A red circle.", "a red square"),
    _rec("2", "train", "The blue circle"),
    _rec("3", "val", "a purple hexagon"),
    _rec("4", "test", "a green triangle"),
]


@pytest.fixture
def simple_tokenizer(monkeypatch):
    """A stand-in tokenizer (lower-case, drop '.'), so these tests do not depend on the real one."""
    mod = types.ModuleType("captioning.data.tokenizer")
    mod.tokenize = lambda text: text.lower().replace(".", " ").split()
    monkeypatch.setitem(sys.modules, "captioning.data.tokenizer", mod)
    return mod


def test_build_vocabulary_uses_train_split_only(simple_tokenizer):
    v = build_vocabulary(RECORDS, min_count=1)
    assert v.itos[4:] == ["a", "circle", "red", "blue", "square", "the"]
    for word in ("purple", "hexagon", "green", "triangle"):
        assert word not in v
    assert build_vocabulary(RECORDS, min_count=2).itos[4:] == ["a", "circle", "red"]
    assert build_vocabulary(RECORDS, min_count=1, max_size=5).itos[4:] == ["a"]


def test_build_vocabulary_without_train_records(simple_tokenizer):
    with pytest.raises(DataError, match="train split is empty"):
        build_vocabulary([r for r in RECORDS if r.split != "train"], min_count=1)


def test_build_vocabulary_with_the_real_tokenizer():
    tok = pytest.importorskip("captioning.data.tokenizer")
    v = build_vocabulary(RECORDS, min_count=1)
    expected = Vocabulary.build([tok.tokenize(c) for r in RECORDS if r.split == "train" for c in r.captions])
    assert v == expected
    assert "red" in v and "purple" not in v
