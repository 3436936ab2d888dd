"""Operations a step dispatches: what bounds a small model's step on a GPU, counted on any device.

On a GPU a decoder step's kernels are tiny, and a step takes about as long as it takes to issue
them (Python, the dispatcher, the kernel launch).  The number of aten operations dispatched, views
and allocations left out, is about the number of kernels launched, and it is the same on every
device, so a CPU measures it (``captioning-bench train`` reports it as ``ops_per_step``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["NO_KERNEL", "dispatched_ops"]

#: aten operations that launch no kernel (views, metadata, allocation), left out of ``dispatched_ops``
NO_KERNEL = frozenset({
    "view", "_unsafe_view", "as_strided", "slice", "select", "t", "transpose", "permute", "unsqueeze", "squeeze",
    "expand", "reshape", "_reshape_alias", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind",
    "narrow", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
})


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += func.overloadpacket.__name__ not in NO_KERNEL
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn: Callable[[], None]) -> int:
    """Aten operations one call of ``fn`` dispatches (forward, backward, optimizer), views and
    allocations left out: about the kernels it launches on a GPU, where a decoder step is bound by
    issuing them (the same count on any device, so a CPU measures it)."""
    counter = _OpCounter()
    with counter:
        fn()
    return counter.ops
