"""Where and when: position codes for annotation vectors.

A region vector of a CNN grid does not know where in the image it lies (only padding artefacts
hint at it), and a pooled frame vector does not know when it was taken: attention over such
vectors is blind to layout and to order (a video and its frames shuffled give the same scores).
A code per position -- 2-D for an ``h x w`` grid, 1-D over the ``K`` sampled frames, 3-D for
per-frame grids -- is concatenated with (or added to) each annotation vector before attention,
so the scores can prefer a place or a time and the context ``z_t = sum_i alpha_ti v_i`` tells
the decoder where and when it looked.  Mean pooling gains nothing from it: the mean of the codes
is the same constant for every item, so the decoders apply codes only where they attend.

Codes: ``sinusoidal`` (Vaswani et al. 2017, one block of sines/cosines per axis) or ``learned``
(one embedding table per axis, as in ViT/DETR's learned variants).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError

__all__ = ["PositionCode", "axis_split", "build_position_code", "layout_from_meta", "sinusoid"]

CODES = ("none", "sinusoidal", "learned")
MODES = ("concat", "add")


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """``[P]`` integer positions -> ``[P, dim]``: ``sin(p / 10000^(2i/dim))``, ``cos(...)`` pairs."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float32, device=positions.device)  # on the positions' device
    freq = torch.exp(-math.log(10000.0) * i / max(half, 1))
    angle = positions.float().unsqueeze(1) * freq.unsqueeze(0)  # [P, half]
    code = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(-1, 2 * half)
    if 2 * half < dim:  # odd dim: one zero column
        code = torch.cat([code, code.new_zeros(code.shape[0], dim - 2 * half)], 1)
    return code


def axis_split(dim: int, axes: int) -> list[int]:
    """Split ``dim`` code channels over ``axes`` axes (even sizes first, the rest to the last)."""
    base = (dim // axes) // 2 * 2
    return [base] * (axes - 1) + [dim - base * (axes - 1)]


def layout_from_meta(meta: dict) -> tuple[int, ...] | None:
    """The position layout of a FeatureStore's annotation vectors: ``(h, w)`` image grid,
    ``(K,)`` pooled frames, ``(K, h, w)`` per-frame grids; None when the meta does not say, and
    for a set of image regions (meta ``regions``, e.g. detector boxes): they have no order."""
    if meta.get("regions"):
        return None
    positions = int(meta.get("positions") or 0)
    grid = [int(g) for g in meta.get("grid") or []]
    if meta.get("kind", "image") == "image":
        return tuple(grid) if len(grid) == 2 else ((positions,) if positions else None)
    frames = int(meta.get("frames") or 0)
    if len(grid) == 2 and frames and positions == frames * grid[0] * grid[1] and grid != [1, 1]:
        return (frames, grid[0], grid[1])
    return (positions,) if positions else None


class PositionCode(nn.Module):
    """Annotation vectors with a code of their position: ``values [B,N,C] -> [B,N,out_dim]``.

    ``layout``: the axes of the N positions in row-major order (``N = prod(layout)``), e.g.
    ``(7, 7)`` for a grid, ``(16,)`` for frames.  ``mode=concat``: ``[v_i ; p_i]`` with a
    ``dim``-channel code (``out_dim = C + dim``); ``mode=add``: ``v_i + p_i`` with a ``C``-channel
    code (``out_dim = C``).
    """

    def __init__(self, layout: Sequence[int], feature_dim: int, code: str = "sinusoidal",
                 mode: str = "concat", dim: int = 64) -> None:
        super().__init__()
        if code not in CODES[1:]:
            raise ConfigError(f"model.position_code={code!r} is not one of {list(CODES)}")
        if mode not in MODES:
            raise ConfigError(f"model.position_mode={mode!r} is not one of {list(MODES)}")
        self.layout = tuple(int(n) for n in layout)
        if not self.layout or min(self.layout) < 1:
            raise ConfigError(f"position code: layout {list(layout)} must be positive axis sizes")
        self.mode = mode
        width = dim if mode == "concat" else feature_dim
        sizes = axis_split(width, len(self.layout))
        if min(sizes) < 2:  # a sine and a cosine per axis at least (axis_split gives 0 below 2 per axis)
            what = (f"model.position_dim={width}" if mode == "concat"
                    else f"position_mode=add with {width}-channel features")
            raise ConfigError(f"{what} is too small for {len(self.layout)} axes (2 channels per axis at least)")
        self.out_dim = feature_dim + width if mode == "concat" else feature_dim
        if code == "sinusoidal":
            parts = [sinusoid(torch.arange(n), d) for n, d in zip(self.layout, sizes, strict=True)]
            self.register_buffer("tables", torch.cat(_broadcast(parts, self.layout), 1), persistent=False)
            self.axes = None
        else:
            self.axes = nn.ParameterList(
                [nn.Parameter(torch.randn(n, d) * 0.02) for n, d in zip(self.layout, sizes, strict=True)]
            )

    @property
    def positions(self) -> int:
        return math.prod(self.layout)

    def codes(self) -> Tensor:
        """``[N, width]``: the code of every position (row-major over the layout)."""
        if self.axes is None:
            return self.tables
        return torch.cat(_broadcast(list(self.axes), self.layout), 1)

    def forward(self, values: Tensor) -> Tensor:
        b, n, _ = values.shape
        if n != self.positions:
            raise ConfigError(
                f"position code: the features have {n} positions but the layout {list(self.layout)} "
                f"has {self.positions}; the features do not match the checkpoint's feature meta"
            )
        code = self.codes().to(values.dtype).unsqueeze(0).expand(b, n, -1)
        return torch.cat([values, code], -1) if self.mode == "concat" else values + code


def build_position_code(layout: Sequence[int] | None, feature_dim: int, code: str, mode: str,
                        dim: int) -> PositionCode | None:
    """A decoder's position code of its ``feature_dim``-channel annotation vectors (the
    ``model.position_code``/``position_mode``/``position_dim`` keys); None for ``code="none"``.

    ``layout``: the decoder's (``layout_from_meta``); a code needs one, and region features have none.
    """
    if code == "none":
        return None
    if layout is None:
        raise ConfigError("model.position_code needs the layout of the features (grid or frames) "
                          "from the feature store meta, which region features have not; "
                          "set model.position_code=none")
    return PositionCode(layout, feature_dim, code, mode, dim)


def _broadcast(parts: list[Tensor], layout: tuple[int, ...]) -> list[Tensor]:
    """Per-axis tables ``[n_a, d_a]`` -> per-position blocks ``[prod(layout), d_a]`` (row-major)."""
    out = []
    for a, table in enumerate(parts):
        shape = [1] * len(layout) + [table.shape[1]]
        shape[a] = layout[a]
        full = table.reshape(shape).expand(*layout, table.shape[1])
        out.append(full.reshape(-1, table.shape[1]))
    return out
