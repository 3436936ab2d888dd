"""Caption table: a dataset's captions tokenized once into flat arrays that training memory-maps.

As neuraltalk2's and self-critical.pytorch's ``prepro_labels`` do, the annotation files are read
and every caption tokenized once, into one file of flat arrays; the training process and its
DataLoader workers map that file (its pages are the page cache's, shared by every process) instead
of holding the captions as Python objects, and the JSON parse's peak is paid once, by the process
that builds the table.  With I items, K captions, W tokens and L distinct words:

- ``words``: L strings, the lexicon: every toolkit token (``tokenizer.tokenize``) of any split, in
  order of first appearance;  ``train_counts``: [L] int64, how often each occurs in train captions
  (the vocabulary is built from these, ``vocabulary``);
- ``tokens``: [W] int32 lexicon ids, the captions back to back;  ``caption_offsets``: [K+1] int64,
  caption k is ``tokens[caption_offsets[k]:caption_offsets[k+1]]``;
- ``item_offsets``: [I+1] int64, item i's captions are k in ``[item_offsets[i], item_offsets[i+1])``;
  ``split``: [I] int8 (0 train, 1 val, 2 test);
- ``item_ids``: I strings (the store keys);  ``item_meta``: I strings, JSON of each record's
  ``source_id``, ``path``, ``kind`` and ``extra``;  ``raw``: K strings, the captions as read.

A string column is two arrays: its UTF-8 bytes ([B] uint8) and [n+1] int64 offsets into them.

The file (``<annotation file stem>-<inputs hash>.captions`` in ``data.caption_cache``, by default
``<data.root>/caption_tables``) starts with a JSON header naming each array's dtype, shape and byte
offset and the sha256 of the bytes after it; it is written atomically.  Its name carries the hash
of everything the table is made from (the annotation files' bytes, the reader's settings, for
video formats the media folder's file names, and the source of the reader and the tokenizer), so
a changed input is a new name and is built afresh: a stale table is never read.  A file whose
checksum or layout does not hold is an error naming it.  Annotation files larger than
``CHILD_BYTES`` are read in a child process, so that the parse's peak (about 2.3x the file's size
in Python objects) never counts in the training process's memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import mmap
import multiprocessing
import os
from array import array
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cached_property
from pathlib import Path

import numpy as np

from captioning.config import DataConfig
from captioning.data import annotations, records, tokenizer
from captioning.data.annotations import ANNOTATION_FORMATS, SPLITS, read_dataset
from captioning.data.media import video_files_by_id
from captioning.data.records import CaptionRecord
from captioning.data.tokenizer import tokenize
from captioning.data.vocab import BOS, EOS, SPECIALS, UNK, Vocabulary, no_training_captions
from captioning.errors import DataError
from captioning.utils.io import atomic_write, file_sha256, stream_sha256

log = logging.getLogger(__name__)

MAGIC = b"CAPTIONTABLE\n"
VERSION = 1
ALIGN = 64  # every array starts at a multiple of this many bytes
CHILD_BYTES = 1 << 20  # annotation files above this size are read in a child process
SPLIT_CODES = {name: code for code, name in enumerate(SPLITS)}
ARRAYS = ("train_counts", "tokens", "caption_offsets", "item_offsets", "split")
STRINGS = ("words", "item_ids", "item_meta", "raw")


class Strings(Sequence[str]):
    """n strings as UTF-8 ``data`` [B] uint8 and ``offsets`` [n+1] int64: string i is
    ``data[offsets[i]:offsets[i+1]]``; decoded when read."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data, self.offsets = data, offsets

    @classmethod
    def of(cls, texts: Iterable[str]) -> Strings:
        data, ends = bytearray(), array("q", [0])
        for t in texts:
            data += t.encode("utf-8", "surrogateescape")
            ends.append(len(data))
        return cls(np.frombuffer(bytes(data), dtype=np.uint8), np.frombuffer(ends, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return bytes(self.data[a:b]).decode("utf-8", "surrogateescape")


class CaptionTable:
    """A dataset's items and tokenized captions as flat arrays (see the module docstring).

    ``path`` is the file the arrays are mapped from, or None for a table built in memory
    (``from_records``).
    """

    def __init__(self, arrays: dict[str, np.ndarray], path: Path | None = None, skipped: int = 0) -> None:
        self.arrays, self.path, self.skipped = arrays, path, skipped
        self.train_counts: np.ndarray = arrays["train_counts"]  # [L]
        self.tokens: np.ndarray = arrays["tokens"]  # [W]
        self.caption_offsets: np.ndarray = arrays["caption_offsets"]  # [K+1]
        self.item_offsets: np.ndarray = arrays["item_offsets"]  # [I+1]
        self.split: np.ndarray = arrays["split"]  # [I]
        self.item_ids, self.item_meta, self.raw, self.lexicon = (
            Strings(arrays[f"{s}.data"], arrays[f"{s}.offsets"]) for s in ("item_ids", "item_meta", "raw", "words"))

    def __len__(self) -> int:
        return len(self.split)

    def __reduce__(self):  # a mapped table travels (spawned workers) as its path, not its bytes
        return (open_table, (self.path,)) if self.path is not None else object.__reduce__(self)

    @cached_property
    def words(self) -> list[str]:
        """The lexicon as a list (L strings, small: the distinct words)."""
        return list(self.lexicon)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_records(cls, recs: Iterable[CaptionRecord], skipped: int = 0) -> CaptionTable:
        """The table of ``recs`` in memory, each caption tokenized as the metrics do."""
        lexicon: dict[str, int] = {}
        counts, tokens, lengths, per_item, split = array("q"), array("i"), array("q"), array("q"), array("b")
        ids, meta, raw = [], [], []
        for r in recs:
            train = r.split == "train"
            split.append(SPLIT_CODES[r.split])
            ids.append(r.item_id)
            meta.append(json.dumps({"source_id": r.source_id, "path": r.path, "kind": r.kind, "extra": r.extra}))
            per_item.append(len(r.captions))
            for caption in r.captions:
                raw.append(caption)
                words = " ".join(tokenize(caption)).split()  # the words of the metrics' reference string
                for w in words:
                    j = lexicon.setdefault(w, len(lexicon))
                    if j == len(counts):
                        counts.append(0)
                    counts[j] += train
                    tokens.append(j)
                lengths.append(len(words))
        arrays = {"train_counts": np.frombuffer(counts, dtype=np.int64), "tokens": np.frombuffer(tokens, dtype=np.int32),
                  "caption_offsets": _offsets(lengths), "item_offsets": _offsets(per_item),
                  "split": np.frombuffer(split, dtype=np.int8)}
        for name, texts in (("words", lexicon), ("item_ids", ids), ("item_meta", meta), ("raw", raw)):
            column = Strings.of(texts)
            arrays[f"{name}.data"], arrays[f"{name}.offsets"] = column.data, column.offsets
        return cls(arrays, skipped=skipped)

    def save(self, path: str | Path) -> Path:
        """Write the table to ``path`` atomically: header, then each array at an aligned offset."""
        layout, at = {}, 0
        for name, a in self.arrays.items():
            layout[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": at}
            at += -(-a.nbytes // ALIGN) * ALIGN
        digest = hashlib.sha256()
        for a in self.arrays.values():
            digest.update(np.ascontiguousarray(a).tobytes())
            digest.update(b"\0" * (-a.nbytes % ALIGN))
        header = json.dumps({"version": VERSION, "arrays": layout, "bytes": at, "sha256": digest.hexdigest(),
                             "items": len(self), "captions": len(self.caption_offsets) - 1,
                             "skipped": self.skipped}).encode()
        start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(MAGIC + len(header).to_bytes(8, "little") + header)
                f.write(b"\0" * (start - f.tell()))
                for a in self.arrays.values():
                    f.write(np.ascontiguousarray(a).tobytes())
                    f.write(b"\0" * (-a.nbytes % ALIGN))

        return atomic_write(path, write)

    # ------------------------------------------------------------------ reading
    def rows(self, split: str | None = None) -> np.ndarray:
        """[n] int64 item indices of ``split`` (every item for None), in file order."""
        return np.arange(len(self)) if split is None else np.flatnonzero(self.split == SPLIT_CODES[split])

    def caption(self, k: int) -> np.ndarray:
        """Caption k's lexicon ids ([T] int32, a view of the table)."""
        return self.tokens[self.caption_offsets[k]: self.caption_offsets[k + 1]]

    def references(self, i: int) -> list[str]:
        """Item i's references as the metrics read them: toolkit tokens joined by spaces."""
        words = self.words
        return [" ".join(words[t] for t in self.caption(k).tolist())
                for k in range(int(self.item_offsets[i]), int(self.item_offsets[i + 1]))]

    def record(self, i: int) -> CaptionRecord:
        """Item i as the reader made it."""
        meta = json.loads(self.item_meta[i])
        caps = tuple(self.raw[k] for k in range(int(self.item_offsets[i]), int(self.item_offsets[i + 1])))
        return CaptionRecord(self.item_ids[i], meta["source_id"], meta["path"], caps, SPLITS[int(self.split[i])],
                             meta["kind"], meta["extra"])

    def vocabulary(self, min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """The vocabulary of the train captions (``vocab.build_vocabulary`` of the same records)."""
        train = self.rows("train")
        if not (self.item_offsets[train + 1] - self.item_offsets[train]).any():
            raise no_training_captions()
        counts = {w: int(c) for w, c in zip(self.words, self.train_counts.tolist(), strict=True) if c}
        return Vocabulary.from_counts(counts, min_count=min_count, max_size=max_size)

    def encode(self, k: int, encoder: np.ndarray, max_length: int) -> np.ndarray:
        """[T+2] int32 ``<bos> w_1..w_T <eos>``: caption k in the vocabulary of ``encoder`` (``encoder``
        of it), cut to ``max_length`` words, as ``vocab.encode`` of its reference string is."""
        words = self.caption(k)[:max_length]
        out = np.empty(len(words) + 2, dtype=np.int32)
        out[0], out[1:-1], out[-1] = BOS, encoder[words], EOS
        return out

    def encoder(self, vocab: Vocabulary) -> np.ndarray:
        """[L] int32: the vocabulary id of each lexicon word (``<unk>`` for words out of it and for
        the special strings), so that ``encoder[caption(k)]`` is ``vocab.encode`` of caption k."""
        return np.array([UNK if w in SPECIALS else vocab.stoi.get(w, UNK) for w in self.words], dtype=np.int32)


class References(Sequence[list[str]]):
    """The references of table rows ``rows`` ([n] int64): entry i is ``table.references(rows[i])``,
    decoded when read (the split being evaluated, not every caption of the dataset, as strings)."""

    def __init__(self, table: CaptionTable, rows: np.ndarray) -> None:
        self.table, self.rows = table, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> list[str]:  # type: ignore[override]
        return self.table.references(int(self.rows[i]))


def _offsets(lengths: array) -> np.ndarray:
    """[n+1] int64: 0 and the running sums of ``lengths``."""
    return np.concatenate([[0], np.cumsum(np.frombuffer(lengths, dtype=np.int64))]).astype(np.int64)


# --------------------------------------------------------------------------- the file
def open_table(path: str | Path) -> CaptionTable:
    """Map a saved table; a file that is not one, or whose bytes or layout do not hold, raises a
    DataError naming it."""
    path = Path(path)

    def corrupt(why: str) -> DataError:
        return DataError(f"caption table {path} is corrupt ({why}): delete it and it is rebuilt from the annotations")

    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 8)
        if len(head) < len(MAGIC) + 8 or not head.startswith(MAGIC):
            raise corrupt("no caption table header")
        try:
            header = json.loads(f.read(int.from_bytes(head[len(MAGIC):], "little")))
            start = -(-f.tell() // ALIGN) * ALIGN
            if header.get("version") != VERSION:
                raise corrupt(f"format version {header.get('version')!r}, this code reads {VERSION}")
            if os.fstat(f.fileno()).st_size != start + header["bytes"]:
                raise corrupt(f"{os.fstat(f.fileno()).st_size} bytes, the header says {start + header['bytes']}")
            f.seek(start)
            if stream_sha256(f) != header["sha256"]:
                raise corrupt("checksum mismatch")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            arrays = {name: np.frombuffer(mapped, dtype=np.dtype(a["dtype"]), count=int(np.prod(a["shape"])),
                                          offset=start + a["offset"]).reshape(a["shape"])
                      for name, a in header["arrays"].items()}
        except (ValueError, KeyError, TypeError) as e:
            raise corrupt(str(e)) from None
    problem = _layout_problem(arrays)
    if problem:
        raise corrupt(problem)
    return CaptionTable(arrays, path, skipped=int(header.get("skipped", 0)))


def _layout_problem(a: dict[str, np.ndarray]) -> str | None:
    """Why the arrays are not one table (None when their sizes agree)."""
    missing = [n for n in (*ARRAYS, *(f"{s}.{p}" for s in STRINGS for p in ("data", "offsets"))) if n not in a]
    if missing:
        return f"no array {missing[0]!r}"
    items, captions = len(a["split"]), len(a["caption_offsets"]) - 1
    ends = {"caption_offsets": len(a["tokens"]), "item_offsets": captions,
            **{f"{s}.offsets": len(a[f"{s}.data"]) for s in STRINGS}}
    for name, end in ends.items():
        if len(a[name]) == 0 or a[name][0] != 0 or a[name][-1] != end:
            return f"{name} do not span 0..{end}"
    sizes = {"item_offsets": items + 1, "item_ids.offsets": items + 1, "item_meta.offsets": items + 1,
             "raw.offsets": captions + 1, "words.offsets": len(a["train_counts"]) + 1}
    for name, n in sizes.items():
        if len(a[name]) != n:
            return f"{name} has {len(a[name])} entries, expected {n}"
    return None


# --------------------------------------------------------------------------- the cache
def inputs_hash(cfg: DataConfig) -> str:
    """sha256 of what the table of ``cfg`` is made from: the annotation files' bytes, the reader's
    settings, a video dataset's media file names, and the source of the code that reads and tokenizes."""
    h = hashlib.sha256(json.dumps({"version": VERSION, "format": cfg.format, "kind": cfg.kind,
                                   "on_error": cfg.on_error, "media_dir": str(cfg.media_dir)}).encode())
    for key in sorted(cfg.annotations):
        if cfg.annotations[key]:
            h.update(f"\0{key}\0".encode())
            try:
                h.update(file_sha256(cfg.annotations[key]).encode())
            except OSError:
                h.update(b"unreadable")  # the reader reports it
    if cfg.kind == "video":
        h.update(json.dumps(sorted(video_files_by_id(cfg.media_dir).items())).encode())
    for module in (inspect.getmodule(ANNOTATION_FORMATS.get(cfg.format)), annotations, records, tokenizer):
        h.update(Path(inspect.getfile(module)).read_bytes())
    return h.hexdigest()


def table_path(cfg: DataConfig) -> Path:
    """Where the table of ``cfg`` lives: ``<data.caption_cache>/<stem>-<hash>.captions``."""
    folder = Path(cfg.caption_cache or Path(cfg.root) / "caption_tables")
    first = next((Path(f) for _, f in sorted(cfg.annotations.items()) if f), Path(cfg.name))
    return folder / f"{first.stem}-{inputs_hash(cfg)[:20]}.captions"


def build_table(cfg: DataConfig, path: str | Path) -> Path:
    """Read ``cfg``'s annotations (``read_dataset``) and save their table at ``path``."""
    dataset = read_dataset(cfg)
    return CaptionTable.from_records(dataset.records, skipped=len(dataset.skipped)).save(path)


def caption_table(cfg: DataConfig, isolate: bool | None = None) -> CaptionTable:
    """The table of ``cfg``: mapped from the cache, or built first.

    isolate: build in a child process (None: when the annotation files exceed ``CHILD_BYTES``).
    """
    path = table_path(cfg)
    if not path.is_file():
        size = sum(Path(f).stat().st_size for f in cfg.annotations.values() if f and Path(f).is_file())
        if isolate if isolate is not None else size > CHILD_BYTES:
            plain = dataclasses.replace(cfg, annotations=dict(cfg.annotations))  # no OmegaConf containers
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
                child.submit(build_table, plain, path).result()
        else:
            build_table(cfg, path)
        log.info("%s: caption table written to %s", cfg.name, path)
    table = open_table(path)
    if table.skipped:
        log.warning("%s: %d annotation problems were skipped when %s was built (read_dataset lists them)",
                    cfg.name, table.skipped, path)
    return table
