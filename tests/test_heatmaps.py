"""Attention figures: smooth upsampling puts the peak where the attention is; figures render."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from captioning.viz.image_grid import (
    brightest_cell,
    build_image_attention_figure,
    cell_center,
    gaussian_blur,
    image_attention_figure,
    render_overlay,
    upsample_attention,
)
from captioning.viz.video_frames import (
    brightest_frame,
    build_video_attention_figure,
    most_attended_frames,
    select_strip_frames,
    video_attention_figure,
)

GRID = (7, 7)
SIZE = 224  # 32 pixels per cell


def one_hot(r: int, c: int, grid=GRID) -> np.ndarray:
    a = np.zeros(grid[0] * grid[1])
    a[r * grid[1] + c] = 1.0
    return a


def cell_of_pixel(y: int, x: int, size=SIZE, grid=GRID) -> tuple[int, int]:
    return int(y * grid[0] // size), int(x * grid[1] // size)


def synthetic_image(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("cell", [(0, 0), (3, 4), (6, 6), (1, 5)])
def test_upsample_peak_lands_in_the_attended_cell(cell):
    up = upsample_attention(one_hot(*cell), (SIZE, SIZE), grid=GRID)
    assert up.shape == (SIZE, SIZE) and up.dtype == np.float32
    assert up.min() == pytest.approx(0.0, abs=1e-6) and up.max() == pytest.approx(1.0)
    y, x = np.unravel_index(int(np.argmax(up)), up.shape)
    assert cell_of_pixel(y, x) == cell
    # the cell centre is at the peak (border cells plateau out to the image edge), and the map is smooth
    cx, cy = cell_center(cell, GRID, (SIZE, SIZE))
    if 0 < cell[0] < 6 and 0 < cell[1] < 6:
        assert up[int(cy), int(cx)] >= 0.98
        assert abs(x - cx) <= 2.5 and abs(y - cy) <= 2.5
    assert np.abs(np.diff(up, axis=0)).max() < 0.2 and np.abs(np.diff(up, axis=1)).max() < 0.2
    # the attended cell holds most of the mass; a far-away cell almost none
    r, c = cell
    inside = up[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32].mean()
    far_r, far_c = (6 - r, 6 - c) if (6 - r, 6 - c) != cell else (0, 6)
    far = up[far_r * 32 : (far_r + 1) * 32, far_c * 32 : (far_c + 1) * 32].mean()
    assert inside > 0.5 and far < 0.01


def test_upsample_accepts_2d_non_square_and_flat_maps():
    a = np.zeros((3, 5))
    a[2, 1] = 1.0
    up = upsample_attention(a, (60, 100))
    y, x = np.unravel_index(int(np.argmax(up)), up.shape)
    assert (y // 20, x // 20) == (2, 1)
    flat = np.full(49, 1 / 49)
    assert np.allclose(upsample_attention(flat, (10, 10)), 1.0)  # uniform attention -> all ones
    with pytest.raises(ValueError, match="grid"):
        upsample_attention(np.ones(10), (10, 10))
    raw = upsample_attention(one_hot(3, 3), (SIZE, SIZE), grid=GRID, normalise=False)
    assert 0.0 <= raw.min() and raw.max() <= 1.0  # clipped to the input range: no bicubic overshoot


def test_gaussian_blur_preserves_mass_and_peak():
    a = np.zeros((21, 21))
    a[10, 10] = 1.0
    b = gaussian_blur(a, 2.0)
    assert b.sum() == pytest.approx(1.0, abs=1e-6)
    assert np.unravel_index(int(np.argmax(b)), b.shape) == (10, 10)
    assert np.allclose(b, b.T) and np.allclose(b, b[::-1])


def test_brightest_cell_and_center():
    assert brightest_cell(one_hot(2, 5), GRID) == (2, 5)
    assert brightest_cell(one_hot(2, 5).reshape(7, 7)) == (2, 5)
    assert brightest_cell(one_hot(4, 1)) == (4, 1)  # square length inferred
    assert cell_center((0, 0), (7, 7), (224, 224)) == (16.0, 16.0)
    assert cell_center((1, 2), (2, 4), (100, 200)) == (125.0, 75.0)


@pytest.mark.parametrize("cell", [(1, 1), (5, 2)])
def test_render_overlay_gray_brightest_pixel_in_cell(cell):
    black = np.zeros((SIZE, SIZE, 3), np.uint8)
    over = render_overlay(black, one_hot(*cell), GRID, cmap="gray", alpha=1.0)
    assert over.shape == (SIZE, SIZE, 3) and over.dtype == np.uint8
    lum = over.astype(float).sum(-1)
    y, x = np.unravel_index(int(np.argmax(lum)), lum.shape)
    assert cell_of_pixel(y, x) == cell
    # on a busy image too: the overlay deviates most from the (gray) image inside the cell
    img = synthetic_image()
    over_b = render_overlay(img, one_hot(*cell), GRID, cmap="gray", alpha=0.8).astype(float)
    base = (img.astype(float) @ np.array([0.299, 0.587, 0.114]))[..., None]
    gain = (over_b - base).sum(-1)
    y, x = np.unravel_index(int(np.argmax(gain)), gain.shape)
    assert cell_of_pixel(y, x) == cell


def test_render_overlay_caption_scale_keeps_weak_maps_dim():
    black = np.zeros((SIZE, SIZE, 3), np.uint8)
    uniform = np.full(49, 1 / 49)
    dim = render_overlay(black, uniform, GRID, cmap="gray", alpha=1.0, vmax=1.0)
    assert dim.max() <= 0.05 * 255
    per_map = render_overlay(black, uniform, GRID, cmap="gray", alpha=1.0)  # min-max per map
    assert per_map.min() == 255


def _panel_pixels(fig, ax, png_path):
    """Crop the saved PNG to the pixels of ``ax`` (figure saved without bbox cropping)."""
    png = np.asarray(Image.open(png_path).convert("RGB")).astype(float)
    fig.canvas.draw()
    bb = ax.get_window_extent()
    H = png.shape[0]
    assert png.shape[:2] == (round(fig.bbox.height), round(fig.bbox.width))
    y0, y1 = int(np.ceil(H - bb.y1)) + 2, int(np.floor(H - bb.y0)) - 2
    x0, x1 = int(np.ceil(bb.x0)) + 2, int(np.floor(bb.x1)) - 2
    return png[y0:y1, x0:x1]


@pytest.mark.parametrize("cell", [(2, 5), (6, 0)])
def test_saved_figure_panel_is_brightest_at_attended_cell(tmp_path, cell):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    black = np.zeros((SIZE, SIZE, 3), np.uint8)
    tokens = ["a", "thing"]
    att = np.stack([np.full(49, 1 / 49), one_hot(*cell)])
    fig = build_image_attention_figure(black, tokens, att, GRID, cmap="gray", alpha=1.0)
    FigureCanvasAgg(fig)
    out = tmp_path / "fig.png"
    fig.savefig(out, format="png", dpi=100)
    panel = _panel_pixels(fig, fig.axes[2], out)
    lum = panel.sum(-1)
    y, x = np.unravel_index(int(np.argmax(lum)), lum.shape)
    ph, pw = lum.shape
    assert (int(y * 7 // ph), int(x * 7 // pw)) == cell
    # the diffuse word stays dark with caption-wide scaling
    assert _panel_pixels(fig, fig.axes[1], out).max() < 40


def test_image_attention_figure_20_words_and_hard_points(tmp_path):
    rng = np.random.default_rng(1)
    tokens = [f"word{i}" for i in range(19)] + ["a-very-long-token-that-gets-shortened"]
    att = rng.dirichlet(np.ones(49), size=20).reshape(20, 7, 7)
    img = np.asarray(Image.new("RGB", (300, 200), (120, 160, 200)))
    hard = [brightest_cell(a) for a in att]
    out = image_attention_figure(
        img,
        tokens,
        att,
        GRID,
        tmp_path / "sub" / "f.png",
        hard_points=hard,
        title="<b>$x$</b> caption",
    )
    assert out.is_file()
    with Image.open(out) as im:
        w, h = im.size
    assert h > 600 and w > 1000  # 21 panels wrap into 4 rows of 6
    # special characters in tokens are plain text (no mathtext errors)
    image_attention_figure(img, ["$", "50$", "x_1^2"], att[:3], GRID, tmp_path / "g.png")


@pytest.mark.parametrize("name, fmt", [("f.jpg", "JPEG"), ("f.JPEG", "JPEG"), ("f.png", "PNG"), ("f.fig", "PNG")])
def test_figure_bytes_match_the_file_suffix(tmp_path, name, fmt):
    """A figure saved as x.jpg is a JPEG (it was PNG bytes under a .jpg name); unknown suffixes get PNG."""
    att = np.full((2, 7, 7), 1 / 49)
    img = np.asarray(Image.new("RGB", (64, 64), (120, 160, 200)))
    out = image_attention_figure(img, ["a", "b"], att, GRID, tmp_path / name)
    with Image.open(out) as im:
        assert im.format == fmt


def test_image_attention_figure_rejects_mismatched_shapes(tmp_path):
    img = synthetic_image(64)
    with pytest.raises(ValueError, match="tokens"):
        image_attention_figure(img, ["a", "b"], np.ones((3, 49)) / 49, GRID, tmp_path / "x.png")
    with pytest.raises(ValueError, match="grid"):
        image_attention_figure(img, ["a"], np.ones((1, 50)) / 50, GRID, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_video_helpers():
    att = np.zeros((3, 10))
    att[0, 4] = att[1, 4] = 1.0
    att[2, 7] = 1.0
    assert [brightest_frame(r) for r in att] == [4, 4, 7]
    assert most_attended_frames(att, 2) == [4, 7]
    assert select_strip_frames(10) == list(range(10))
    strip = select_strip_frames(32, [5], 16)
    assert len(strip) == 16 and 5 in strip and strip == sorted(strip)
    assert 0 in select_strip_frames(32, [], 16) and 31 in select_strip_frames(32, [], 16)


@pytest.mark.parametrize("K,forced", [(12, 7), (24, 13), (32, 29)])
def test_video_figure_highlights_the_forced_frame(tmp_path, K, forced):
    rng = np.random.default_rng(K)
    frames = rng.integers(0, 255, size=(K, 48, 64, 3), dtype=np.uint8)
    T = 16
    att = np.full((T, K), 0.2 / (K - 1))
    att[:, forced] = 0.8
    tokens = [f"w{i}" for i in range(T)]
    frame_indices = [3 * k for k in range(K)]
    fig, info = build_video_attention_figure(frames, tokens, att, frame_indices)
    assert info["overall"] == forced and info["per_word"] == [forced] * T
    assert forced in info["strip"]
    assert len(info["strip"]) == min(K, 16)
    thick = [
        k
        for k, ax in zip(info["strip"], info["strip_axes"], strict=True)
        if ax.spines["top"].get_linewidth() >= 4
    ]
    assert thick == [forced]
    labels = [ax.get_xlabel() for ax in info["strip_axes"]]
    assert labels[info["strip"].index(forced)] == str(frame_indices[forced])
    out = video_attention_figure(frames, tokens, att, frame_indices, tmp_path / "v.png")
    assert out.is_file() and Image.open(out).size[0] >= 800


def test_video_figure_hard_and_validation(tmp_path):
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    att = np.eye(8)[[0, 3, 3, 7]]
    out = video_attention_figure(
        frames, ["a", "b", "c", "d"], att, list(range(8)), tmp_path / "h.png", hard=True
    )
    assert out.is_file()
    with pytest.raises(ValueError, match="rows"):
        video_attention_figure(frames, ["a"], att, list(range(8)), tmp_path / "bad.png")
    with pytest.raises(ValueError, match="frame_indices"):
        video_attention_figure(frames, ["a", "b", "c", "d"], att, [0, 1], tmp_path / "bad.png")
