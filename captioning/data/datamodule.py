"""Datasets over a FeatureStore and the caption annotations, and the Lightning DataModule.

Training sees one sample per (item, reference caption): an item with five references is
seen five times per epoch, each time with a different caption (Xu et al., Karpathy);
self-critical training sees one sample per item.  Evaluation sees one sample per item; its
references are looked up by index.

The DataLoader fetches a whole batch at once (``__getitems__``): each item's features are read
by one ``pread`` straight into its row of the batch tensor, which inside a worker is allocated in
shared memory, where the batch has to go anyway.  ``collate`` of per-sample ``__getitem__``
results gives the same batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, get_worker_info

from captioning.data.annotations import SPLITS
from captioning.data.caption_table import CaptionTable, References
from captioning.data.records import CaptionRecord
from captioning.data.vocab import Vocabulary
from captioning.errors import DataError
from captioning.store.feature_store import FeatureStore

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """A padded batch.

    features: [B, N, C] float (fp16 in storage, cast by the model);  mask: [B, N] bool (True = real);
    tokens: [B, T+2] long (``<bos> w_1..w_T <eos>`` padded with ``<pad>``) or None at evaluation;
    index: [B] long, the item's index in the split (to look up ids and references).
    """

    features: torch.Tensor
    mask: torch.Tensor
    tokens: torch.Tensor | None
    index: torch.Tensor

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory (the DataLoader's ``pin_memory=True`` calls this), so
        that ``to(device, non_blocking=True)`` copies asynchronously."""
        return Batch(self.features.pin_memory(), self.mask.pin_memory(),
                     None if self.tokens is None else self.tokens.pin_memory(), self.index.pin_memory())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.features.to(device, non_blocking=True),
            self.mask.to(device, non_blocking=True),
            None if self.tokens is None else self.tokens.to(device, non_blocking=True),
            self.index.to(device, non_blocking=True),
        )


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

    def batch(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, N, C] features of items ``rows``, each read straight into its row of one tensor (in
        shared memory inside a DataLoader worker), and the [B, N] mask (True = real position)."""
        store = self.store
        feats = torch.from_numpy(np.empty((len(rows), store.positions, store.dim), dtype=store.dtype))
        if get_worker_info() is not None:
            feats.share_memory_()
        view = feats.numpy()
        valid = torch.tensor([store.read(str(self.ids[i]), out=view[b]).valid for b, i in enumerate(rows)])
        return feats, torch.arange(store.positions)[None, :] < valid[:, None]


def read_batch(items: FeatureItems, rows: list[int], tokens: list[list[int]] | list[np.ndarray] | None,
               pad: int = 0) -> Batch:
    """What ``collate`` makes of the samples (item ``rows[b]``, caption ``tokens[b]``), read as one batch."""
    if tokens is not None:  # longest caption first, as collate orders them (a stable sort, like its own)
        order = sorted(range(len(rows)), key=lambda b: -len(tokens[b]))
        rows, tokens = [rows[b] for b in order], [tokens[b] for b in order]
    feats, mask = items.batch(rows)
    return Batch(feats, mask, None if tokens is None else pad_tokens(tokens, pad), torch.tensor(rows))


def pad_tokens(seqs: list[list[int]] | list[np.ndarray] | list[torch.Tensor], pad: int = 0) -> torch.Tensor:
    """[B, max length] long: the sequences right-padded with ``pad``."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for b, seq in enumerate(seqs):
        out[b, : len(seq)] = torch.as_tensor(seq)
    return out


class CaptionTrainDataset(Dataset):
    """One sample per (item, reference caption).

    Sample k is item ``item[k]`` with the table's caption ``caption_index[k]``, encoded when read
    (``CaptionTable.encode``): two flat [S] arrays over the memory-mapped table, never copied into
    the workers (reading a Python list writes reference counts, which copies its pages, one by
    one over an epoch, into every worker).
    """

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int) -> None:
        self.items = items
        self.pad = vocab.pad
        self.max_length = max_length
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
        return read_batch(self.items, self.item[ks].tolist(), [self.caption(k) for k in ks], self.pad)


class CaptionItemDataset(Dataset):
    """One sample per item with ONE of its reference captions, drawn at random each epoch
    (self-critical training: the model samples its own captions; the reference is for the
    optional cross-entropy term).

    The draw of item i in epoch e comes from a generator of its own, seeded by (``seed``, e, i):
    never from a process's random stream, so loader workers (``num_workers``) change nothing.  The
    epoch (``set_epoch``) sits in shared memory, where the loader's worker processes read it.
    """

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int, seed: int = 0) -> None:
        self.items = items
        self.pad = vocab.pad
        self.max_length = max_length
        self.encoder = items.table.encoder(vocab)  # [L]
        self.seed = int(seed) % 2**32
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next draws belong to (the training loop sets it as each epoch starts)."""
        self._epoch.fill_(int(epoch))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        feats, valid = self.items.features(i)
        return torch.from_numpy(feats), valid, torch.tensor(self._draw(i)), i

    def __getitems__(self, rows: list[int]) -> Batch:
        return read_batch(self.items, rows, [self._draw(i) for i in rows], self.pad)

    def _draw(self, i: int) -> list[int]:
        n = int(self.items.n_captions[i])
        k = int(self.items.first_caption[i])
        if n > 1:
            k += int(np.random.default_rng([self.seed, int(self._epoch), int(i)]).integers(n))
        return self.items.table.encode(k, self.encoder, self.max_length).tolist()


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

    Training batches come sorted by caption length, longest first (``index`` keeps each
    row's item): the LSTM decoder's packed loss then needs no gather of the features to
    drop finished captions from the end of the batch.  A ``Batch`` (a dataset's ``__getitems__``
    read it whole) is returned as it is.
    """
    if isinstance(samples, Batch):
        return samples
    if samples[0][2] is not None:
        samples = sorted(samples, key=lambda s: -len(s[2]))
    feats = torch.stack([s[0] for s in samples])
    n = feats.shape[1]
    valid = torch.tensor([s[1] for s in samples])
    mask = torch.arange(n)[None, :] < valid[:, None]
    index = torch.tensor([s[3] for s in samples])
    if samples[0][2] is None:
        return Batch(feats, mask, None, index)
    return Batch(feats, mask, pad_tokens([s[2] for s in samples], pad), index)


class CaptionDataModule(pl.LightningDataModule):
    """Train/val/test loaders over a FeatureStore.  ``splits``: a ``CaptionTable`` (its train, val
    and test rows), or each split's list of CaptionRecord."""

    def __init__(
        self,
        splits: CaptionTable | dict[str, list[CaptionRecord]],
        store: FeatureStore,
        vocab: Vocabulary,
        *,
        max_length: int = 20,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        per_item: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.per_item = per_item  # training samples: one per item (self-critical) or per caption
        self.seed = seed  # the loaders' own generators and SCST's reference draws
        self.store = store
        self.vocab = vocab
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.items = ({name: FeatureItems(splits, store, name) for name in SPLITS} if isinstance(splits, CaptionTable)
                      else {name: FeatureItems(recs, store) for name, recs in splits.items()})
        for name, items in self.items.items():
            if len(items) == 0 and name in ("train", "val"):

                raise DataError(
                    f"split '{name}' has no items with features in {store.root}: "
                    "run captioning-extract for this dataset first"
                )

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        # The shuffle takes its seed from the process's random stream once per epoch, whatever the
        # number of workers (a resumed run draws what an uninterrupted one would); the seed a
        # DataLoader draws for its workers comes from a generator of its own (drawn from the
        # process's stream it would shift dropout by one draw per epoch without workers only).
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=RandomSampler(dataset) if shuffle else None,
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.num_workers,
            collate_fn=collate,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
            drop_last=False,
        )

    def train_dataloader(self) -> DataLoader:
        if self.per_item:
            ds = CaptionItemDataset(self.items["train"], self.vocab, self.max_length, seed=self.seed)
            ds.set_epoch(self.trainer.current_epoch if self.trainer is not None else 0)
        else:
            ds = CaptionTrainDataset(self.items["train"], self.vocab, self.max_length)
        return self._loader(ds, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["val"]), self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["test"]), self.eval_batch_size, shuffle=False)

    def loader(self, split: str) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items[split]), self.eval_batch_size, shuffle=False)
