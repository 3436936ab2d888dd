"""Teacher-forced log-likelihood of given captions: the score of a forced-choice probe.

``caption_log_likelihoods`` feeds each candidate caption ``<bos> w_1..w_T`` to a decoder through
its inference protocol (``init_state`` / ``step``, ``captioning.models.decoders.base``) and sums
``log p(w_t | w_<t, image)`` over the words and the closing ``<eos>``: the same numbers that
greedy and beam search add up for their own output, so it works for every registered decoder and
for test-time ensembles alike.  Batched: candidates of several items share one pass, each row
reading its item's encoded memory; float32 model, float64 sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Candidate:
    """A caption to score against item ``item`` (a row of the features batch): its word ids
    (no ``<bos>``/``<eos>``)."""

    item: int
    ids: tuple[int, ...]


def caption_log_likelihoods(decoder, features: Tensor, mask: Tensor | None, candidates: Sequence[Candidate],
                            bos: int, eos: int, max_rows: int = 1024) -> list[tuple[float, int]]:
    """``(sum of token log-probs incl. <eos>, number of tokens)`` of each candidate.

    ``features [B,N,C]`` and ``mask [B,N]`` (True = real position) are the items the candidates
    name by index.  The decoder runs in eval mode and float32 (its mode is restored afterwards);
    at most ``max_rows`` candidates run at once.  Length-normalised score: sum / tokens.
    """
    was_training = decoder.training
    decoder.eval()
    out: list[tuple[float, int]] = []
    try:
        with torch.no_grad():
            for start in range(0, len(candidates), max_rows):
                out += _score_rows(decoder, features, mask, candidates[start: start + max_rows], bos, eos)
    finally:
        decoder.train(was_training)
    return out


def _score_rows(decoder, features: Tensor, mask: Tensor | None, rows: Sequence[Candidate], bos: int,
                eos: int) -> list[tuple[float, int]]:
    """One pass over ``rows``: their items encoded once, each row reading its item's memory."""
    if not rows:
        return []
    device = features.device
    items = sorted({c.item for c in rows})
    slot = {item: k for k, item in enumerate(items)}
    pick = torch.tensor(items, device=device)
    state = decoder.init_state(features.index_select(0, pick).float(),
                               None if mask is None else mask.index_select(0, pick))
    state = state.index_select(torch.tensor([slot[c.item] for c in rows], device=device))
    lengths = torch.tensor([len(c.ids) + 1 for c in rows], device=device)  # words + <eos>
    steps = int(lengths.max())
    targets = torch.full((len(rows), steps), eos, dtype=torch.long, device=device)
    for r, c in enumerate(rows):
        if c.ids:
            targets[r, : len(c.ids)] = torch.tensor(c.ids, dtype=torch.long)
    inputs = torch.cat([torch.full((len(rows), 1), bos, dtype=torch.long, device=device), targets[:, :-1]], 1)
    total = torch.zeros(len(rows), dtype=torch.float64, device=device)
    for t in range(steps):
        log_probs, _, state = decoder.step(inputs[:, t], state)
        lp = log_probs.float().gather(1, targets[:, t: t + 1]).squeeze(1).double()
        total += torch.where(t < lengths, lp, torch.zeros_like(lp))
    return [(float(s), int(n)) for s, n in zip(total.cpu().tolist(), lengths.cpu().tolist(), strict=True)]
