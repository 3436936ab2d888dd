"""Datasets over a FeatureStore and the caption annotations, and the Lightning DataModule.

Training sees one sample per (item, reference caption): an item with five references is
seen five times per epoch, each time with a different caption (Xu et al., Karpathy);
self-critical training sees one sample per item.  Evaluation sees one sample per item; its
references are looked up by index.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from captioning.data.records import CaptionRecord
from captioning.data.tokenizer import tokenize
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

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.features.to(device, non_blocking=True),
            self.mask.to(device, non_blocking=True),
            None if self.tokens is None else self.tokens.to(device, non_blocking=True),
            self.index.to(device, non_blocking=True),
        )


class FeatureItems:
    """The items of one split that have features: ids, references and store access.

    ``references[i]`` holds the toolkit-tokenized reference captions of item i (space-joined),
    which is what the metrics compare against.
    """

    def __init__(self, records: list[CaptionRecord], store: FeatureStore) -> None:
        present = [r for r in records if r.item_id in store]
        self.missing = len(records) - len(present)
        if self.missing:
            log.warning("%d of %d items have no features in %s (failed or not extracted); they are skipped",
                        self.missing, len(records), store.root)
        self.records = present
        self.store = store
        self.references = [[" ".join(tokenize(c)) for c in r.captions] for r in present]

    def __len__(self) -> int:
        return len(self.records)

    def features(self, i: int) -> tuple[np.ndarray, int]:
        item = self.store[self.records[i].item_id]
        return item.features, item.valid


class CaptionTrainDataset(Dataset):
    """One sample per (item, reference caption)."""

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int) -> None:
        self.items = items
        self.samples: list[tuple[int, list[int]]] = []
        for i, refs in enumerate(items.references):
            for ref in refs:
                ids = vocab.encode(ref.split(), max_length)
                self.samples.append((i, [vocab.bos] + ids + [vocab.eos]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, k: int):
        i, tokens = self.samples[k]
        feats, valid = self.items.features(i)
        return torch.from_numpy(np.array(feats)), valid, torch.tensor(tokens), i


class CaptionItemDataset(Dataset):
    """One sample per item with ONE of its reference captions, drawn at random each time
    (self-critical training: the model samples its own captions; the reference is for the
    optional cross-entropy term)."""

    def __init__(self, items: FeatureItems, vocab: Vocabulary, max_length: int) -> None:
        self.items = items
        self.tokens = [[[vocab.bos] + vocab.encode(ref.split(), max_length) + [vocab.eos] for ref in refs]
                       for refs in items.references]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        feats, valid = self.items.features(i)
        refs = self.tokens[i]
        k = int(torch.randint(len(refs), ())) if len(refs) > 1 else 0
        return torch.from_numpy(np.array(feats)), valid, torch.tensor(refs[k]), i


class CaptionEvalDataset(Dataset):
    """One sample per item (free decoding; references come from ``items.references``)."""

    def __init__(self, items: FeatureItems) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        feats, valid = self.items.features(i)
        return torch.from_numpy(np.array(feats)), valid, None, i


def collate(samples, pad: int = 0) -> Batch:
    """Stack features, build the position mask from valid counts, right-pad the token ids.

    Training batches come sorted by caption length, longest first (``index`` keeps each
    row's item): the LSTM decoder's packed loss then needs no gather of the features to
    drop finished captions from the end of the batch.
    """
    if samples[0][2] is not None:
        samples = sorted(samples, key=lambda s: -len(s[2]))
    feats = torch.stack([s[0] for s in samples])
    n = feats.shape[1]
    valid = torch.tensor([s[1] for s in samples])
    mask = torch.arange(n)[None, :] < valid[:, None]
    index = torch.tensor([s[3] for s in samples])
    if samples[0][2] is None:
        return Batch(feats, mask, None, index)
    length = max(len(s[2]) for s in samples)
    tokens = torch.full((len(samples), length), pad, dtype=torch.long)
    for b, s in enumerate(samples):
        tokens[b, : len(s[2])] = s[2]
    return Batch(feats, mask, tokens, index)


class CaptionDataModule(pl.LightningDataModule):
    """Train/val/test loaders over a FeatureStore.  Splits are lists of CaptionRecord."""

    def __init__(
        self,
        splits: dict[str, list[CaptionRecord]],
        store: FeatureStore,
        vocab: Vocabulary,
        *,
        max_length: int = 20,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        per_item: bool = False,
    ) -> None:
        super().__init__()
        self.per_item = per_item  # training samples: one per item (self-critical) or per caption
        self.store = store
        self.vocab = vocab
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.items = {name: FeatureItems(recs, store) for name, recs in splits.items()}
        for name, items in self.items.items():
            if len(items) == 0 and name in ("train", "val"):

                raise DataError(
                    f"split '{name}' has no items with features in {store.root}: "
                    "run captioning-extract for this dataset first"
                )

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=collate,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
            drop_last=False,
        )

    def train_dataloader(self) -> DataLoader:
        kind = CaptionItemDataset if self.per_item else CaptionTrainDataset
        ds = kind(self.items["train"], self.vocab, self.max_length)
        return self._loader(ds, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["val"]), self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["test"]), self.eval_batch_size, shuffle=False)

    def loader(self, split: str) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items[split]), self.eval_batch_size, shuffle=False)
