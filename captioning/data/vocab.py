"""Word vocabulary: fixed specials, min-count threshold, encode/decode, JSON save/load.

Ids 0..3 are always ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; words follow by decreasing
training count (ties alphabetical), so a vocabulary built twice from the same data is identical.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from captioning.data.records import CaptionRecord
from captioning.data.tokenizer import tokenize
from captioning.errors import CheckpointError, ConfigError, DataError
from captioning.utils.io import atomic_write_json, read_json

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
FORMAT_VERSION = 1


class Vocabulary:
    """Index <-> word mapping.

    itos: list of words, ``itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]``.
    stoi: word -> id.
    """

    PAD, BOS, EOS, UNK = PAD, BOS, EOS, UNK
    pad, bos, eos, unk = PAD, BOS, EOS, UNK

    def __init__(self, itos: Sequence[str], min_count: int | None = None) -> None:
        self.itos: list[str] = list(itos)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        self.min_count = min_count
        problem = _itos_problem(self.itos)
        if problem:
            raise ValueError(f"invalid vocabulary: {problem}")

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls, token_lists: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None
    ) -> Vocabulary:
        """Vocabulary of the words seen at least ``min_count`` times in ``token_lists``.

        max_size: at most this many entries in all, the 4 specials included (the most frequent
        words are kept).  Special strings met as words are not added twice.
        """
        _check_sizes(min_count, max_size)
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            if isinstance(tokens, str):
                raise TypeError("Vocabulary.build takes lists of tokens, not strings: tokenize the captions first")
            counts.update(tokens)
        return cls.from_counts(counts, min_count, max_size)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """``build`` from each word's training count (``counts``: word -> times seen)."""
        _check_sizes(min_count, max_size)
        words = [w for w, c in counts.items() if c >= min_count and w not in SPECIALS and w and not w.isspace()]
        words.sort(key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max_size - len(SPECIALS)]
        return cls([*SPECIALS, *words], min_count=min_count)

    # ------------------------------------------------------------------ mapping
    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} entries, min_count={self.min_count})"

    def encode(self, tokens: Sequence[str], max_length: int | None = None) -> list[int]:
        """Word ids of ``tokens`` (no ``<bos>``/``<eos>``), cut to ``max_length``.

        Unknown words, and the special strings themselves, become ``<unk>``.
        """
        if max_length is not None and max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {max_length}")
        if isinstance(tokens, str):
            raise TypeError("Vocabulary.encode takes a list of tokens, not a string")
        ids = [self.stoi.get(t, UNK) if t not in SPECIALS else UNK for t in tokens]
        return ids if max_length is None else ids[:max_length]

    def decode(self, ids: Iterable[Any]) -> list[str]:
        """Words of ``ids``: stops at ``<eos>``, drops ``<pad>`` and ``<bos>``."""
        words = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i in (PAD, BOS):
                continue
            if not 0 <= i < len(self.itos):
                raise ValueError(f"token id {i} is outside the vocabulary (size {len(self.itos)})")
            words.append(self.itos[i])
        return words

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        """Plain-data form (what checkpoints store under ``hyper_parameters['vocab']``)."""
        return {"version": FORMAT_VERSION, "itos": list(self.itos), "min_count": self.min_count}

    @classmethod
    def from_dict(cls, d: Any, source: str = "checkpoint vocabulary") -> Vocabulary:
        """Inverse of ``to_dict``; a malformed dict raises CheckpointError naming ``source``."""
        return cls._from_dict(d, source, CheckpointError)

    @classmethod
    def _from_dict(cls, d: Any, source: str, error: type[Exception]) -> Vocabulary:
        if not isinstance(d, dict) or not isinstance(d.get("itos"), list):
            raise error(f"{source} is not a vocabulary: expected an object with an 'itos' list of words")
        if d.get("version", FORMAT_VERSION) != FORMAT_VERSION:
            raise error(f"{source} has vocabulary format version {d.get('version')!r}; this code reads "
                        f"version {FORMAT_VERSION}")
        problem = _itos_problem(d["itos"])
        if problem:
            raise error(f"{source} is not a valid vocabulary: {problem}")
        min_count = d.get("min_count")
        return cls(d["itos"], min_count=min_count if isinstance(min_count, int) else None)

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (a crash never leaves a partial file)."""
        return atomic_write_json(path, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read a ``save``d vocabulary; a missing or invalid file raises DataError naming it."""
        return cls._from_dict(read_json(path, "vocabulary file"), f"vocabulary file {path}", DataError)


def no_training_captions() -> DataError:
    """The error of a vocabulary asked of an empty train split."""
    return DataError("no training captions to build the vocabulary from: the train split is empty "
                     "(check data.annotations and the split names)")


def _check_sizes(min_count: Any, max_size: int | None) -> None:
    if not isinstance(min_count, int) or isinstance(min_count, bool) or min_count < 1:
        raise ConfigError(f"data.min_count={min_count!r} is not valid: use an integer >= 1")
    if max_size is not None and max_size < len(SPECIALS):
        raise ConfigError(f"vocabulary max_size={max_size} is too small: it must be >= {len(SPECIALS)}")


def _itos_problem(itos: list[Any]) -> str | None:
    """Why ``itos`` is not a valid word list (None when it is)."""
    if list(itos[: len(SPECIALS)]) != list(SPECIALS):
        return f"the first entries must be {list(SPECIALS)} (got {list(itos[: len(SPECIALS)])})"
    seen: set[str] = set()
    for i, w in enumerate(itos):
        if not isinstance(w, str) or not w or w.isspace():
            return f"entry {i} is not a non-empty string ({w!r})"
        if w in seen:
            return f"duplicate word {w!r} (entry {i})"
        seen.add(w)
    return None


def build_vocabulary(records: Iterable[CaptionRecord], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
    """Vocabulary of the TRAIN records' captions, tokenized with ``captioning.data.tokenizer.tokenize``.

    Records of other splits are ignored, so validation/test words never enter the vocabulary.
    """

    seen = 0

    def token_lists() -> Iterator[list[str]]:  # one caption's tokens at a time: counted, then dropped
        nonlocal seen
        for r in records:
            if r.split == "train":
                for c in r.captions:
                    seen += 1
                    yield tokenize(c)

    vocab = Vocabulary.build(token_lists(), min_count=min_count, max_size=max_size)
    if not seen:
        raise no_training_captions()
    return vocab
