"""Decoding ahead: the next batches' JPEGs decoded on the device while this batch runs forward.

``DecodeAhead(loader, ...)`` iterates a DataLoader's batches (``collate_media``'s, the device
JPEGs still encoded) and hands each on with its JPEGs decoded and resized on the device
(``decode_on_device``) by one thread, ``depth`` batches ahead of the batch the job runs.  On a GPU
the thread decodes on its own CUDA stream and records an event when a batch's pixels are ready;
the job's stream waits for that event (``wait_for``) instead of the host waiting for the device,
so decoding, the forward of the batch before and the writing of the one before that overlap.

nvJPEG's hardware engine does not honour the stream it is given (pytorch/vision#9606: on an H100
torchvision's decode overwrote memory still in use in 134 of 200 iterations; torchcodec#1634
drains the stream before decoding): the thread drains its stream before each decode call.  It
costs the job nothing: that stream holds only the previous batch's decode, which the thread
waited for anyway, and the main thread never waits on it.  Pixels made on the decode stream and
used on the job's stream are recorded there (``Tensor.record_stream``), so the caching allocator
does not hand their memory to the next decode before the forward has read them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import DataLoader

from captioning.features.backbones import Preprocessing
from captioning.features.device_decode import decode_on_device

__all__ = ["DecodeAhead", "wait_for"]


class DecodeAhead:
    """``loader``'s batches with their encoded JPEGs decoded on ``device`` by a thread, ``depth``
    batches ahead (see the module docstring); ``library``: ``captioning.features.device_decode``'s."""

    def __init__(self, loader: DataLoader, pre: Preprocessing, device: torch.device, depth: int = 2,
                 library: str = "torchcodec") -> None:
        self.loader = loader
        self.pre = pre
        self.device = torch.device(device)
        self.depth = max(1, depth)
        self.library = library

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = iter(self.loader)  # the workers are forked before the decoding thread starts
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        pending: deque[Future] = deque()
        with ThreadPoolExecutor(1, thread_name_prefix="decode-ahead") as pool:
            try:
                for batch in batches:
                    pending.append(pool.submit(self._decode, batch, stream))
                    if len(pending) > self.depth:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def _decode(self, batch: dict[str, Any], stream: torch.cuda.Stream | None) -> dict[str, Any]:
        """One batch, on the decoding thread: its pixels on the device and, on a GPU, ``ready``: the
        event after which they are there."""
        if stream is None:
            return decode_on_device(batch, self.pre, self.device, self.library)
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.synchronize()  # drained before each decode call (see the module docstring)
            batch = decode_on_device(batch, self.pre, self.device, self.library)
            batch["ready"] = torch.cuda.Event()
            batch["ready"].record(stream)
        return batch


def wait_for(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Make ``device``'s current stream wait for a batch decoded ahead (no host wait) and keep its
    pixels' memory from the decoder until that stream has used them."""
    ready = batch.pop("ready", None)
    if ready is not None:
        current = torch.cuda.current_stream(device)
        current.wait_event(ready)
        batch["pixels"].record_stream(current)
    return batch
