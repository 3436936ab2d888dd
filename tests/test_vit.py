"""Vision transformers through timm (``encoder.name=timm:<vit>``): the patch tokens laid out as the
patch grid (prefix tokens dropped, (H / patch, W / patch) from the patch embedding, any input size
through ``dynamic_img_size``), the model's own normalisation (CLIP's), fine-tuning of the last
transformer blocks, and extract -> train -> caption with heatmaps over the patches.  Random-init
weights (``encoder.weights=none``): nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from test_extract import run_extract_cli

from captioning.errors import ConfigError
from captioning.features.backbones import EncoderConfig, build_backbone, stages
from captioning.features.backbones.timm_models import patch_grid, tokens_to_grid
from captioning.train.finetune import unfreeze_last
from captioning.viz.captions_file import read_captions

VIT = "timm:vit_small_patch16_224"  # 12 blocks, 384 channels, patch 16, one class token
CLIP = "timm:vit_base_patch16_clip_224"  # OpenAI CLIP's image tower: 12 blocks, 768 channels, patch 16
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's published normalisation, not ImageNet's
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIZE = 64  # 4 x 4 patches: small enough for random-init ViTs on CPU


def vit(name: str = VIT, size: int = SIZE, **kw) -> torch.nn.Module:
    return build_backbone(EncoderConfig(name=name, weights="none", image_size=size, **kw))


def extract(tmp: Path, name: str, size: int, n: int) -> tuple[dict, dict[str, np.ndarray]]:
    """``n`` shapes images through ``name`` at ``size`` px: (store meta, features by id)."""
    from captioning.data.synthetic import generate_shapes
    from captioning.features.extract import run_extraction, unique_items
    from captioning.store.feature_store import FeatureStore

    generate_shapes(tmp / "shapes", num_images=n, seed=0, image_size=SIZE, workers=1)
    images = sorted((tmp / "shapes" / "images").glob("*.jpg"))
    run_extraction(unique_items([(p.stem, str(p)) for p in images]), "image", vit(name, size), tmp / "features",
                   trainer={"accelerator": "cpu", "devices": 1}, batch_size=n, num_workers=0, progress=False)
    store = FeatureStore.open(tmp / "features")
    return dict(store.meta), {i: np.asarray(store[i].features, np.float32) for i in store.ids}


# ----------------------------------------------------------------------------- the patch grid


def test_patch_grid_comes_from_the_patch_embedding() -> None:
    net = vit().classifier
    assert patch_grid(net, (448, 448)) == (28, 28) and patch_grid(net, (64, 96)) == (4, 6)
    assert patch_grid(net, (70, 70)) == (4, 4)  # a partial patch at the edge is not a token


def test_tokens_are_laid_out_row_by_row_after_the_prefix_tokens() -> None:
    """A non-square input (64 x 96 px: 4 x 6 patches) gives a 4 x 6 grid whose cell (i, j) is token
    1 + 6 i + j of forward_features (token 0 is the class token), not a sqrt of the token count."""
    b = vit()
    x = torch.randn(1, 3, 64, 96)
    with torch.inference_mode():
        grid = b(x)
        tokens = b.classifier.forward_features(x)  # [1, 1 + 24, 384]
    assert grid.shape == (1, 384, 4, 6) and tokens.shape == (1, 25, 384)
    for i, j in [(0, 0), (0, 5), (3, 0), (2, 4)]:
        torch.testing.assert_close(grid[0, :, i, j], tokens[0, 1 + 6 * i + j])
    toy = torch.arange(2 * 7 * 3, dtype=torch.float32).view(2, 7, 3)  # 1 prefix token + a 2 x 3 grid
    torch.testing.assert_close(tokens_to_grid(toy, 1, (2, 3), "toy")[1, :, 1, 2], toy[1, 6])


def test_tokens_that_are_not_the_patch_grid_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^encoder.name=timm:odd: its 7 tokens after 1 prefix tokens are not its "
                                          r"2x4 patch grid; use encoder.layer=<block index>[^\n]*$"):
        tokens_to_grid(torch.zeros(1, 8, 16), 1, (2, 4), "timm:odd")


def test_a_fixed_size_token_model_names_its_size() -> None:
    """MLP-Mixer has a patch embedding but no dynamic_img_size: other sizes are refused by name."""
    b = vit("timm:mixer_s16_224")
    with pytest.raises(ConfigError, match=r"timm:mixer_s16_224 takes 224x224 px inputs only .*encoder.image_size=224"):
        b.output_shape(SIZE)


def test_registers_and_intermediate_blocks() -> None:
    """Prefix tokens are every non-patch token (DeiT's class + distillation tokens); an integer
    ``layer`` is that block's output, laid out by timm's forward_intermediates."""
    deit = vit("timm:deit_tiny_distilled_patch16_224")
    assert deit.classifier.num_prefix_tokens == 2 and deit.output_shape(SIZE) == (192, 4, 4)
    block = vit(layer="-2")
    with torch.inference_mode():
        x = torch.randn(1, 3, SIZE, SIZE)
        grid = block(x)
        ten = block.classifier.forward_intermediates(x, indices=[10], intermediates_only=True)[0]
    assert grid.shape == (1, 384, 4, 4) and block.settings()["layer"] == "-2"
    torch.testing.assert_close(grid, ten)


def test_448_px_gives_a_28_by_28_grid_in_the_store(tmp_path: Path) -> None:
    meta, feats = extract(tmp_path, VIT, 448, n=2)
    assert meta["grid"] == [28, 28] and meta["positions"] == 784 and meta["dim"] == 384
    assert meta["encoder"]["image_size"] == 448 and meta["settings"]["preprocessing"]["size"] == 448
    assert all(f.shape == (784, 384) and np.isfinite(f).all() for f in feats.values())


def test_clip_tower_extracts_with_clips_normalisation(tmp_path: Path) -> None:
    """The CLIP-style ViT normalises with CLIP's mean/std (from its pretrained_cfg), and the stored
    features are its patch tokens for pixels normalised that way (float16)."""
    meta, feats = extract(tmp_path, CLIP, SIZE, n=2)
    pre = meta["settings"]["preprocessing"]
    np.testing.assert_allclose(pre["mean"], OPENAI_CLIP_MEAN) and np.testing.assert_allclose(pre["std"], OPENAI_CLIP_STD)
    assert pre["interpolation"] == "bicubic" and meta["grid"] == [4, 4] and meta["dim"] == 768
    from PIL import Image

    b = vit(CLIP)
    item = sorted(feats)[0]
    pixels = torch.from_numpy(np.array(Image.open(tmp_path / "shapes" / "images" / f"{item}.jpg"))).permute(2, 0, 1)
    x = (pixels.float() / 255 - torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)) / torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)
    with torch.inference_mode():
        tokens = b.classifier.forward_features(x[None])[0, 1:]  # [16, 768]: the patches, class token dropped
    np.testing.assert_allclose(feats[item], tokens.half().float().numpy(), atol=2e-2, rtol=1e-2)


# ------------------------------------------------------------------------------- fine-tuning


def test_vit_stages_are_its_blocks_and_final_norm() -> None:
    b = vit()
    found = stages(b)
    assert [n for n, _ in found] == [f"blocks.{i}" for i in range(12)] + ["norm"]
    net = b.classifier
    first = {id(p) for p in found[0][1].parameters()}  # the embedding runs before block 0: its stage
    assert {id(net.cls_token), id(net.pos_embed), id(net.patch_embed.proj.weight)} <= first
    assert [n for n, _ in stages(vit(layer="-2"))] == [f"blocks.{i}" for i in range(11)]  # block 10 ends it


def test_finetuning_the_last_blocks_trains_exactly_them() -> None:
    """finetune.blocks=3: blocks 10 and 11 and the final norm get gradients and change in a step;
    every other weight (embedding, blocks 0-9, the unused classifier head) stays frozen and equal."""
    b = vit(size=32)
    assert unfreeze_last(b, 3) == ["blocks.10", "blocks.11", "norm"]
    net = b.classifier
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in net.named_parameters() if n.startswith(("blocks.10.", "blocks.11.", "norm."))}
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0)
    (b(torch.randn(2, 3, 32, 32)) * torch.randn(384, 2, 2)).sum().backward()  # a random read-out of the grid
    assert {n for n, p in net.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0} == trained
    opt.step()
    changed = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trained
    with pytest.raises(ConfigError, match=r"finetune.blocks=14 but encoder timm:vit_small_patch16_224 .* 13 stages"):
        unfreeze_last(vit(size=32), 14)


# --------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_vit_extract_train_caption_with_patch_heatmaps(tmp_path: Path) -> None:
    """captioning-extract with a ViT (4 x 4 patches at 64 px) -> captioning-train (1 epoch) ->
    captioning-caption on raw images: attention over the 16 patches, one heatmap figure per image;
    then stage=finetune with finetune.blocks=2 changes the last block and the final norm only."""
    from captioning.data.synthetic import generate_shapes
    from captioning.store.feature_store import FeatureStore

    root, feats, run = tmp_path / "shapes", tmp_path / "features", tmp_path / "train"
    generate_shapes(root, num_images=16, seed=0, image_size=SIZE, workers=1)
    data = ["data=shapes", "data.name=tiny", f"data.root={root}", "data.synthetic=null", f"features_dir={feats}"]
    run_extract_cli(*data, "encoder=timm", f"encoder.name={VIT}", "encoder.weights=none", f"encoder.image_size={SIZE}",
                    "num_workers=0", "batch_size=8", "trainer.enable_progress_bar=false",
                    f"hydra.run.dir={tmp_path / 'hydra_extract'}")
    meta = FeatureStore.open(feats).meta
    assert meta["grid"] == [4, 4] and meta["positions"] == 16 and meta["dim"] == 384
    assert meta["settings"]["name"] == VIT and meta["settings"]["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
    train = ["data.num_workers=0", "data.batch_size=4", "eval_batch_size=4", "model.embed_dim=16", "model.hidden_dim=32",
             "model.attention_dim=16", "trainer.max_epochs=1", "logger=csv", "callbacks.progress=null",
             "callbacks.early_stopping=null", "callbacks.attention_images=null", "trainer.enable_progress_bar=false",
             "optim.warmup_steps=0"]
    run_cli("train", *data, *train, f"hydra.run.dir={run}")
    images = sorted((root / "images").glob("*.jpg"))[-2:]
    out = tmp_path / "captions"
    run_cli("caption", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", f"inputs=[{images[0]},{images[1]}]",
            f"output_dir={out}", "device=cpu", "num_workers=0", "decode.beam_size=2", "decode.max_length=6",
            "progress=false", f"hydra.run.dir={tmp_path / 'hydra_caption'}")
    entries = read_captions(out / "captions.json")
    assert len(entries) == 2 and all("error" not in e for e in entries), entries
    for e in entries:
        assert e["attention_shape"] == [4, 4] and len(e["tokens"]) >= 1
        assert all(len(row) == 16 and sum(row) == pytest.approx(1.0, abs=1e-3) for row in e["attention"])
    assert len(list((out / "figures").glob("*.png"))) == 2

    tuned = tmp_path / "finetune"
    run_cli("train", *data, *train, "stage=finetune", "finetune.blocks=2", "trainer.limit_train_batches=2",
            f"init_from={run / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={tuned}")
    state = torch.load(tuned / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    initial = vit().classifier.state_dict()  # what the store was extracted with: the seeded random init
    changed = {n for n, w in initial.items() if not torch.equal(w, state[f"encoder.classifier.{n}"])}
    assert changed == {n for n in initial if n.startswith(("blocks.11.", "norm."))}
