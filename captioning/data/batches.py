"""Batches over a FeatureStore and the caption annotations: what a training or evaluation step reads.

Training reads **per-image batches** by default: each item (image or video) once per batch with
``k`` of its reference captions, so its features are read and projected once for all of them
(ruotianluo's ``seq_per_img``); ``batching=caption`` reads one sample per (item, caption) instead,
the item once per caption (the Show-Attend-Tell code's way).  Self-critical training reads one
item with one reference (``k = 1``).  Evaluation reads one sample per item; its references are
looked up by index.

A dataset reads a whole batch at once (``__getitems__``): each item's features by one ``pread``
straight into its row of the batch tensor, which inside a DataLoader worker is allocated in shared
memory, where the batch has to go anyway.  The caption lengths travel with the batch on the host,
where the loader knows them, so the step never reads them back from the device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from captioning.data.caption_table import CaptionTable, References
from captioning.data.records import CaptionRecord
from captioning.data.vocab import Vocabulary
from captioning.store.feature_store import FeatureStore

log = logging.getLogger(__name__)

__all__ = ["Batch", "CaptionEvalDataset", "CaptionTrainDataset", "CaptionsPerItemDataset", "FeatureItems",
           "collate", "pad_tokens", "read_batch"]


@dataclass
class Batch:
    """``M`` items and ``R = M * G`` captions, item-major (``G`` captions per item; 1 at evaluation).

    features: ``[M,N,C]`` as stored (fp16; the model casts), None until a device cache fills it;
    mask: ``[M,N]`` bool (True = real position); tokens: ``[R,T+2]`` long (``<bos> w_1..w_T <eos>``
    padded with ``<pad>``) or None at evaluation; index: ``[M]`` the items' indices in the split;
    lengths: ``[R]`` real steps per caption (words + <eos>) on the HOST; full: every position of
    every item is real (known on the host, so the model needs no mask); ready: the CUDA event after
    which a batch copied on a side stream may be read (``PrefetchLoader``), else None.
    """

    features: torch.Tensor | None
    mask: torch.Tensor | None
    tokens: torch.Tensor | None
    index: torch.Tensor
    lengths: torch.Tensor | None = None
    full: bool = False
    ready: Any = None

    @property
    def group(self) -> int:
        """Captions per item ``G``."""
        return 1 if self.tokens is None else self.tokens.shape[0] // max(self.index.shape[0], 1)

    def host_lengths(self) -> list[int] | None:
        """The caption lengths as a list, read on the host (never from a device)."""
        return None if self.lengths is None else self.lengths.tolist()

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory (the DataLoader's ``pin_memory=True`` calls this), so
        that ``to(device, non_blocking=True)`` copies asynchronously."""
        pin = [None if t is None else t.pin_memory() for t in (self.features, self.mask, self.tokens, self.index)]
        return replace(self, features=pin[0], mask=pin[1], tokens=pin[2], index=pin[3])

    def to(self, device: torch.device | str) -> Batch:
        """The device's part of the batch on ``device`` (``lengths`` stay on the host)."""
        moved = [None if t is None else t.to(device, non_blocking=True)
                 for t in (self.features, self.mask, self.tokens, self.index)]
        return replace(self, features=moved[0], mask=moved[1], tokens=moved[2], index=moved[3])


class FeatureItems:
    """The items of one split that have features: ids, captions, references and store access.

    Item i is row ``rows[i]`` of a ``CaptionTable`` (the rows of ``split`` whose id is in the
    store; a list of records is made a table in memory first).  ``ids`` [n] holds the store keys,
    ``first_caption`` / ``n_captions`` [n] int64 where item i's captions are in the table: numpy
    arrays, so a DataLoader worker reading them writes no reference counts and copies no page
    (copy-on-write) over an epoch.  ``references[i]``: item i's toolkit-tokenized references
    (space-joined, what the metrics compare against), decoded from the table when read;
    ``records``: the items as ``CaptionRecord``s, made from the table when first read.
    """

    def __init__(self, source: CaptionTable | Sequence[CaptionRecord], store: FeatureStore,
                 split: str | None = None) -> None:
        table = source if isinstance(source, CaptionTable) else CaptionTable.from_records(source)
        rows = table.rows(split)
        present = [(r, key) for r in rows.tolist() if (key := table.item_ids[r]) in store]
        self.rows = np.array([r for r, _ in present], dtype=np.int64)  # [n]
        self.missing = len(rows) - len(self.rows)
        if self.missing:
            log.warning("%d of %d items have no features in %s (failed or not extracted); they are skipped",
                        self.missing, len(rows), store.root)
        self.table = table
        self.ids = np.array([key for _, key in present], dtype=str)  # [n]
        self.first_caption = table.item_offsets[self.rows]  # [n]
        self.n_captions = table.item_offsets[self.rows + 1] - self.first_caption  # [n]
        self.references = References(table, self.rows)
        self.store = store

    @cached_property
    def records(self) -> list[CaptionRecord]:
        return [self.table.record(r) for r in self.rows.tolist()]

    def __len__(self) -> int:
        return len(self.rows)

    def features(self, i: int) -> tuple[np.ndarray, int]:
        """Item i's [N, C] features (a new array, read by one ``pread``) and its valid count."""
        item = self.store.read(str(self.ids[i]))
        return item.features, item.valid

    def batch(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """[M, N, C] features of items ``rows``, each read straight into its row of one tensor (in
        shared memory inside a DataLoader worker), the [M, N] mask and whether it is all True."""
        store = self.store
        feats = torch.from_numpy(np.empty((len(rows), store.positions, store.dim), dtype=store.dtype))
        if get_worker_info() is not None:
            feats.share_memory_()
        view = feats.numpy()
        valid = [store.read(str(self.ids[i]), out=view[b]).valid for b, i in enumerate(rows)]
        return feats, position_mask(valid, store.positions), min(valid, default=0) == store.positions


def position_mask(valid: list[int], positions: int) -> torch.Tensor:
    """``[M, N]`` bool: True at the first ``valid[m]`` positions of item m."""
    return torch.arange(positions)[None, :] < torch.tensor(valid, dtype=torch.long)[:, None]


def read_batch(items: FeatureItems, rows: list[int], tokens: list[np.ndarray] | list[list[int]] | None,
               pad: int = 0, group: int = 1, features: bool = True) -> Batch:
    """The batch of items ``rows`` and their captions ``tokens`` (``group`` per item, item-major);
    one caption per item (``group == 1``) comes sorted longest first, as ``collate`` orders them.
    ``features=False``: the items' features are left for a device cache (``Batch.features`` None)."""
    if tokens is not None and group == 1:  # a stable sort, like collate's
        order = sorted(range(len(rows)), key=lambda b: -len(tokens[b]))
        rows, tokens = [rows[b] for b in order], [tokens[b] for b in order]
    feats, mask, full = items.batch(rows) if features else (None, None, False)  # the cache fills them
    index = torch.tensor(rows, dtype=torch.long)
    if tokens is None:
        return Batch(feats, mask, None, index, full=full)
    lengths = torch.tensor([len(t) - 1 for t in tokens], dtype=torch.long)
    return Batch(feats, mask, pad_tokens(tokens, pad), index, lengths, full)


def pad_tokens(seqs: list[list[int]] | list[np.ndarray] | list[torch.Tensor], pad: int = 0) -> torch.Tensor:
    """[B, max length] long: the sequences right-padded with ``pad``."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for b, seq in enumerate(seqs):
        out[b, : len(seq)] = torch.as_tensor(seq)
    return out


class CaptionTrainDataset(Dataset):
    """One sample per (item, reference caption) (``batching=caption``).

    Sample k is item ``item[k]`` with the table's caption ``caption_index[k]``, encoded when read
    (``CaptionTable.encode``): two flat [S] arrays over the memory-mapped table, never copied into
    the workers (reading a Python list writes reference counts, which copies its pages, one by
    one over an epoch, into every worker).
    """

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int, features: bool = True) -> None:
        self.items, self.pad, self.max_length, self.read_features = items, vocab.pad, max_length, features
        self.encoder = items.table.encoder(vocab)  # [L]
        counts = items.n_captions
        self.item = np.repeat(np.arange(len(items), dtype=np.int64), counts)  # [S]
        starts = np.repeat(np.cumsum(counts) - counts - items.first_caption, counts)
        self.caption_index = np.arange(len(self.item), dtype=np.int64) - starts  # [S]

    def __len__(self) -> int:
        return len(self.item)

    def caption(self, k: int) -> np.ndarray:
        """Sample k's token ids ([T+2] int32, ``<bos> w_1..w_T <eos>``)."""
        return self.items.table.encode(int(self.caption_index[k]), self.encoder, self.max_length)

    def __getitem__(self, k: int):
        i = int(self.item[k])
        feats, valid = self.items.features(i)
        return torch.from_numpy(feats), valid, torch.from_numpy(self.caption(k).astype(np.int64)), i

    def __getitems__(self, ks: list[int]) -> Batch:
        return read_batch(self.items, self.item[ks].tolist(), [self.caption(k) for k in ks], self.pad,
                          features=self.read_features)


class CaptionsPerItemDataset(Dataset):
    """One sample per item with ``k`` of its reference captions (``batching=image``; self-critical
    training: ``k = 1``, the reference of its optional cross-entropy term).

    Item i's captions in epoch e: all of them in the table's order when it has ``k``; else ``k``
    drawn without replacement (with replacement past its own count) by a generator of its own,
    seeded by (``seed``, e, i): never the process's random stream, so loader workers change
    nothing.  The epoch (``set_epoch``) sits in shared memory, where the workers read it.
    """

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int, k: int, seed: int = 0,
                 features: bool = True) -> None:
        self.items, self.pad, self.max_length, self.k, self.read_features = items, vocab.pad, max_length, k, features
        self.encoder = items.table.encoder(vocab)  # [L]
        self.seed = int(seed) % 2**32
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next draws belong to (the training loop sets it as each epoch starts)."""
        self._epoch.fill_(int(epoch))

    def __len__(self) -> int:
        return len(self.items)

    def captions(self, i: int) -> list[np.ndarray]:
        """Item i's ``k`` captions of this epoch, encoded (``[T+2]`` int32 each)."""
        n, first, k = int(self.items.n_captions[i]), int(self.items.first_caption[i]), self.k
        if n == k:
            picks = list(range(n))
        else:
            rng = np.random.default_rng([self.seed, int(self._epoch.numpy()), int(i)])  # a host read
            if k == 1:
                picks = [int(rng.integers(n))]
            else:
                picks = rng.permutation(n)[:k].tolist() + rng.integers(0, n, max(0, k - n)).tolist()
        return [self.items.table.encode(first + j, self.encoder, self.max_length) for j in picks]

    def __getitem__(self, i: int):
        feats, valid = self.items.features(i)
        return torch.from_numpy(feats), valid, [torch.from_numpy(c.astype(np.int64)) for c in self.captions(i)], i

    def __getitems__(self, rows: list[int]) -> Batch:
        tokens = [c for i in rows for c in self.captions(i)]
        return read_batch(self.items, rows, tokens, self.pad, group=self.k, features=self.read_features)


class CaptionEvalDataset(Dataset):
    """One sample per item (free decoding; references come from ``items.references``)."""

    def __init__(self, items: FeatureItems) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        feats, valid = self.items.features(i)
        return torch.from_numpy(feats), valid, None, i

    def __getitems__(self, rows: list[int]) -> Batch:
        return read_batch(self.items, rows, None)


def collate(samples, pad: int = 0) -> Batch:
    """Stack features, build the position mask from valid counts, right-pad the token ids.

    One caption per sample (``CaptionTrainDataset``) comes sorted by caption length, longest first
    (``index`` keeps each row's item); a sample with a list of captions (``CaptionsPerItemDataset``)
    keeps them grouped, item-major.  A ``Batch`` (a dataset's ``__getitems__`` read it whole) is
    returned as it is.
    """
    if isinstance(samples, Batch):
        return samples
    if samples[0][2] is not None:  # each sample's captions as a list; one each: longest first
        samples = [(f, v, c if isinstance(c, list) else [c], i) for f, v, c, i in samples]
        if len(samples[0][2]) == 1:
            samples = sorted(samples, key=lambda s: -len(s[2][0]))
    feats = torch.stack([s[0] for s in samples])
    valid = [int(s[1]) for s in samples]
    mask, full = position_mask(valid, feats.shape[1]), min(valid) == feats.shape[1]
    index = torch.tensor([s[3] for s in samples])
    if samples[0][2] is None:
        return Batch(feats, mask, None, index, full=full)
    seqs = [c for s in samples for c in s[2]]
    lengths = torch.tensor([len(c) - 1 for c in seqs], dtype=torch.long)
    return Batch(feats, mask, pad_tokens(seqs, pad), index, lengths, full)
