"""The random number generators' states in a checkpoint: torch, NumPy and Python's ``random``.

Stored as tensors, lists and numbers only, so a checkpoint still loads with ``weights_only=True``;
a resumed run then draws the same dropout masks, hard-attention samples and shuffles as one that was
never interrupted.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng() -> dict:
    """This process's generator states: ``{"torch": ByteTensor, "numpy": [...], "python": [...]}``."""
    np_state = np.random.get_state()
    version, state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(int, np_state[2:4]),
                  float(np_state[4])],
        "python": [version, list(state), gauss],
    }


def restore_rng(rng: dict) -> None:
    """Set the generators to the states :func:`capture_rng` returned."""
    torch.set_rng_state(rng["torch"])
    s = rng["numpy"]
    np.random.set_state((s[0], s[1].numpy().astype(np.uint32), s[2], s[3], s[4]))
    p = rng["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
