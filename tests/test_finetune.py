"""End-to-end encoder fine-tuning (``captioning.train.finetune``): the stages of each backbone family,
which weights train, the encoder's learning rate on the decoder's schedule, and through the real
CLI the tutorial's two stages (cross-entropy on stored features, then ``stage=finetune`` from the
raw images): only the unfrozen blocks change, a run killed mid-epoch resumes to the same weights,
and ``captioning-caption`` captions with the fine-tuned encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from faults.faultlib import fault_env, inject_env, killed, resumed_from, state_dicts_equal

from captioning.errors import ConfigError
from captioning.features.backbones import EncoderConfig, build_backbone, stages
from captioning.train.finetune import FinetuneConfig, finetuned_meta, unfreeze_last
from captioning.train.optim import OptimConfig, configure_optimization
from captioning.viz.captions_file import read_captions

IMAGE_SIZE = 64  # EfficientNet-Lite0, stride 32: a 2x2 grid of 1280 channels
LITE0 = EncoderConfig(weights="none", image_size=IMAGE_SIZE)


# ------------------------------------------------------------------------------------ stages


def test_stages_of_each_family(monkeypatch) -> None:
    def on_meta_device(build):  # the torchvision networks' structure without their weights' cost
        with torch.device("meta"):
            return build()

    monkeypatch.setattr("captioning.features.backbones.weights.seeded_init", on_meta_device)
    names = lambda cfg: [n for n, _ in stages(build_backbone(cfg))]  # noqa: E731
    blocks = [f"blocks.{i}" for i in range(7)]
    assert names(LITE0) == ["stem", *blocks, "head"]
    assert names(EncoderConfig(weights="none", layer="-2")) == ["stem", *blocks[:5]]  # stride 16: blocks.4 ends it
    assert names(EncoderConfig(name="resnet50", weights="none", layer="layer3")) == ["stem", "layer1", "layer2",
                                                                                    "layer3"]
    vgg = stages(build_backbone(EncoderConfig(name="vgg16", weights="none", layer="conv4_3")))
    assert [n for n, _ in vgg] == ["conv1", "conv2", "conv3", "conv4"]
    convs = [sum(isinstance(m, torch.nn.Conv2d) for m in s.modules()) for _, s in vgg]
    assert convs == [2, 2, 3, 3]  # conv4 ends at conv4_3's ReLU, before pool4
    # timm models: timm's feature_info stages, found by running the network (on the meta device here)
    assert names(EncoderConfig(name="timm:resnet18", weights="none")) == ["act1", "layer1", "layer2", "layer3",
                                                                          "layer4"]
    assert names(EncoderConfig(name="timm:resnet18", weights="none", layer="2")) == ["act1", "layer1", "layer2"]


def test_a_backbone_registered_without_stages_cannot_be_fine_tuned(monkeypatch) -> None:
    from captioning.features.backbones import BACKBONES
    from captioning.registry import Entry

    lite0 = BACKBONES.entry("efficientnet_lite0")
    monkeypatch.setitem(BACKBONES._entries, "no_stages", Entry("no_stages", lite0.obj, {}))
    with pytest.raises(ConfigError, match=r"encoder no_stages: its stages are not known.*register it with stages="):
        stages(build_backbone(EncoderConfig(name="no_stages", weights="none", image_size=IMAGE_SIZE)))


def test_unfreeze_last_trains_the_last_stages_but_not_batchnorm() -> None:
    b = build_backbone(LITE0)
    assert not any(p.requires_grad for p in b.parameters())
    assert unfreeze_last(b, 2) == ["blocks.6", "head"]
    bn = {f"{n}." for n, m in b.classifier.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    trained = {n for n, p in b.classifier.named_parameters() if p.requires_grad}
    expected = {n for n, _ in b.classifier.named_parameters()
                if n.startswith(("blocks.6.", "conv_head.")) and not any(n.startswith(p) for p in bn)}
    assert trained == expected and len(trained) == 4  # blocks.6's 3 convolutions + the head's
    b.train()
    assert not any(m.training for m in b.modules())  # BatchNorm keeps its statistics
    with pytest.raises(ConfigError, match=r"finetune.blocks=10 but encoder efficientnet_lite0 .* has 9 stages"):
        unfreeze_last(build_backbone(LITE0), 10)


@pytest.mark.parametrize("kind", ["cosine", "step", "plateau"])
def test_the_encoder_group_follows_the_decoder_schedule(kind: str) -> None:
    """Parameter groups (decoder lr 1.0, encoder lr 0.1) through ``configure_optimization``: the
    encoder's group gets the decoder's schedule, whatever the schedule."""
    dec, enc = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    cfg = OptimConfig(lr=1.0, scheduler=kind, step_epochs=1, gamma=0.5, warmup_steps=0, min_lr_ratio=0.0)
    out = configure_optimization([{"params": [dec], "lr": 1.0}, {"params": [enc], "lr": 0.1}], cfg, schedule_steps=2)
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    seen = []
    for score in (1.0, 0.5, 0.4, 0.3, 0.2):
        seen.append([g["lr"] for g in opt.param_groups])
        dec.grad, enc.grad = torch.zeros(1), torch.zeros(1)
        opt.step()
        sched.step(score) if kind == "plateau" else sched.step()
    halves = [[0.5**k, 0.1 * 0.5**k] for k in range(5)]
    want = {"cosine": [[1.0, 0.1], [0.5, 0.05], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], "step": halves,
            "plateau": [[1.0, 0.1]] * 4 + [[0.5, 0.05]]}[kind]  # patience 2: the third bad score halves
    np.testing.assert_allclose(seen, want, rtol=1e-12, atol=1e-12)


def test_what_cannot_be_fine_tuned_is_refused() -> None:
    with pytest.raises(ConfigError, match="finetune.blocks=0"):
        FinetuneConfig(blocks=0).validate()
    with pytest.raises(ConfigError, match="finetune.encoder_lr"):
        FinetuneConfig(encoder_lr=0.0).validate()
    image = {"kind": "image", "settings": {"weights": "none"}, "encoder": {"name": "efficientnet_lite0"}, "dim": 8}
    meta = finetuned_meta(image, FinetuneConfig(blocks=2))
    assert meta["settings"] == {"weights": "none", "finetune": {"blocks": 2}} and meta["dtype"] == "float32"
    with pytest.raises(ConfigError, match="data.kind=image"):
        finetuned_meta({**image, "kind": "video"}, FinetuneConfig())
    with pytest.raises(ConfigError, match="not several feature streams"):
        finetuned_meta({**image, "streams": [image, image]}, FinetuneConfig())


def test_stage_finetune_composes() -> None:
    from test_config import compose_train

    from captioning.config import to_config
    from captioning.train.job import TrainConfig

    cfg = to_config(compose_train("stage=finetune", "init_from=stage1.ckpt"), TrainConfig)
    assert cfg.finetune == FinetuneConfig(blocks=3, encoder_lr=1e-4) and cfg.stage == "finetune"
    assert cfg.run_name == "shapes-soft_attention-additive-ft-s0" and cfg.init_from == "stage1.ckpt"
    assert cfg.callbacks["attention_images"] is None and cfg.data.batch_size == 32
    assert to_config(compose_train(), TrainConfig).stage == "xe"


# ---------------------------------------------------------------------------- the real CLI

STEPS = 2  # optimizer steps per epoch (limit_train_batches), 2 epochs


def cli_args(data: dict, run_dir: Path, *extra: str) -> list[str]:
    return ["data=shapes", "data.name=tiny", f"data.root={data['root']}", "data.synthetic=null",
            f"features_dir={data['features']}", "data.num_workers=0", "data.batch_size=4", "eval_batch_size=4",
            "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "model.dropout=0.1",
            "logger=csv", "callbacks.progress=null", "callbacks.early_stopping=null",
            "callbacks.attention_images=null", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
            "optim.warmup_steps=0", f"trainer.limit_train_batches={STEPS}", f"hydra.run.dir={run_dir}", *extra]


def finetune_args(data: dict, run_dir: Path) -> list[str]:
    return cli_args(data, run_dir, "stage=finetune", "finetune.blocks=2", "finetune.encoder_lr=5e-3",
                    "optim.lr=1e-3", "trainer.max_epochs=2", f"init_from={data['stage1']}")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict:
    """20 shapes images of 64 px (16 train, 2 val, 2 test), their EfficientNet-Lite0 features (random
    weights) and stage 1: the decoder trained on them (one epoch of 2 steps)."""
    from captioning.config import DataConfig
    from captioning.data.annotations import read_dataset
    from captioning.data.synthetic import generate_shapes
    from captioning.features.extract import run_extraction, unique_items

    tmp = tmp_path_factory.mktemp("finetune")
    root = tmp / "shapes"
    generate_shapes(root, num_images=20, seed=0, image_size=IMAGE_SIZE, workers=1)
    records = read_dataset(DataConfig(name="tiny", root=str(root), media_dir=str(root / "images"), annotations={
        s: str(root / "annotations" / f"captions_{s}.json") for s in ("train", "val", "test")})).records
    run_extraction(unique_items([(r.item_id, str(root / "images" / r.path)) for r in records]), "image",
                   build_backbone(LITE0), root / "features", trainer={"accelerator": "cpu", "devices": 1},
                   batch_size=8, num_workers=0, progress=False)
    images = sorted((root / "images").glob("*.jpg"))
    data = {"root": root, "features": root / "features", "images": images, "tmp": tmp}
    train_in_process(tmp / "stage1", *cli_args(data, tmp / "stage1", "trainer.max_epochs=1"))
    data["stage1"] = tmp / "stage1" / "checkpoints" / "last.ckpt"
    return data


def train_in_process(run_dir: Path, *overrides: str) -> dict:
    """The training job without a CLI process (stage 1 is the setup here, not what is tested)."""
    from test_config import CONF, compose, initialize_config_dir, open_dict

    from captioning.config import to_config
    from captioning.train.job import TrainConfig, train

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
    with open_dict(cfg):
        cfg.output_dir = str(run_dir)  # Hydra's run dir
    return train(to_config(cfg, TrainConfig))


@pytest.fixture(scope="module")
def finetuned(shapes) -> dict:
    """Stage 2, uninterrupted: ``stage=finetune`` from the stage-1 checkpoint, 2 epochs of 2 steps."""
    run_dir = shapes["tmp"] / "stage2"
    proc = run_cli("train", *finetune_args(shapes, run_dir))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    return {"run_dir": run_dir, "ckpt": ckpt, "log": proc.stdout + proc.stderr,
            "state": torch.load(ckpt, map_location="cpu", weights_only=True)}


@pytest.mark.slow
def test_finetune_changes_only_the_unfrozen_blocks(shapes, finetuned) -> None:
    from captioning.store.feature_store import FeatureStore

    state = finetuned["state"]
    assert state["global_step"] == 2 * STEPS and f"initialised from {shapes['stage1']}" in finetuned["log"]
    hp = state["hyper_parameters"]
    assert hp["config"]["stage"] == "finetune" and hp["config"]["finetune"] == {"blocks": 2, "encoder_lr": 5e-3}
    store_meta = FeatureStore.open(shapes["features"]).meta
    assert hp["feature_meta"]["settings"] == {**store_meta["settings"], "finetune": {"blocks": 2}}
    initial = build_backbone(LITE0).classifier  # what the store was extracted with: seeded random weights
    bn = tuple(f"{n}." for n, m in initial.named_modules() if isinstance(m, torch.nn.BatchNorm2d))
    changed, same = [], []
    for name, before in initial.state_dict().items():
        after = state["state_dict"][f"encoder.classifier.{name}"]
        (same if torch.equal(before, after) else changed).append(name)
    trainable = [n for n in initial.state_dict() if n.startswith(("blocks.6.", "conv_head.")) and not n.startswith(bn)]
    assert sorted(changed) == sorted(trainable) and len(trainable) == 4, changed
    assert any(n.startswith("bn2.running_") for n in same) and any(n.startswith("blocks.6.0.bn1.") for n in same)
    # the encoder's parameter group: its own learning rate on the decoder's cosine schedule
    rows = [r for r in csv_rows(finetuned["run_dir"]) if r.get("lr-AdamW/pg2")]
    assert len(rows) == 2 * STEPS
    for r in rows:
        assert float(r["lr-AdamW/pg2"]) == pytest.approx(5.0 * float(r["lr-AdamW/pg1"]), rel=1e-6)
    assert float(rows[0]["lr-AdamW/pg2"]) == pytest.approx(5e-3) and float(rows[-1]["lr-AdamW/pg2"]) < 5e-3


def csv_rows(run_dir: Path) -> list[dict]:
    import csv

    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_finetune_resumes_after_a_kill_with_the_same_weights(shapes, finetuned, tmp_path: Path) -> None:
    """Killed after the first optimizer step of epoch 2 (epoch 1 committed in last.ckpt); the same
    command resumes there and ends with the uninterrupted run's weights, bit for bit."""
    run_dir = tmp_path / "killed"
    args = finetune_args(shapes, run_dir)
    proc = run_cli("train", *args, env=inject_env(**fault_env("kill", "step", n=STEPS)), check=False)
    assert killed(proc), proc.stderr[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == STEPS
    again = run_cli("train", *args)
    assert resumed_from(again) == [(str(last), STEPS)]
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 2 * STEPS
    state_dicts_equal(state["state_dict"], finetuned["state"]["state_dict"])


@pytest.mark.slow
def test_caption_uses_the_finetuned_encoder(shapes, finetuned, tmp_path: Path) -> None:
    """``captioning-caption`` on the fine-tuned checkpoint = ``Captioner`` with the checkpoint's encoder
    weights, whose features are the fine-tuned network's and not the store's (random-init) encoder's."""
    from conftest import featurize_files

    from captioning.caption.api import Captioner
    from captioning.features.featurize import featurize_streams

    images = shapes["images"][-2:]
    captioner = Captioner.from_checkpoint(finetuned["ckpt"], device="cpu")
    (encoder,) = captioner.encoders()
    for name, w in encoder.classifier.state_dict().items():
        assert torch.equal(w, finetuned["state"]["state_dict"][f"encoder.classifier.{name}"]), name
    (tuned,) = featurize_streams(captioner.encoders(), captioner.feature_meta, [(str(i), str(p)) for i, p in
                                                                              enumerate(images)])  # as it captions
    base = featurize_files(build_backbone(LITE0), images, "image")
    for t, b in zip(tuned, base, strict=True):
        assert t.error is None and t.features.dtype == torch.float32 and t.features.shape == (4, 1280)
        with torch.no_grad():  # the training path: crop -> normalise -> encoder -> [h*w, C]
            want = captioner.module.encode(t.pixels[None])[0]
        # the two paths batch differently: float32 sums in another order (1.2e-5 seen single-threaded)
        torch.testing.assert_close(t.features, want, atol=1e-4, rtol=1e-4)
        assert (t.features - b.features.float()).abs().max() > 1e-3  # not the features the store holds

    out = tmp_path / "captions"
    run_cli("caption", f"ckpt_path={finetuned['ckpt']}", f"inputs=[{images[0]},{images[1]}]", f"output_dir={out}",
            "device=cpu", "num_workers=0", "decode.beam_size=2", "decode.max_length=8", "progress=false",
            f"hydra.run.dir={tmp_path / 'hydra'}")
    entries = read_captions(out / "captions.json")
    direct = captioner.caption(images, beam_size=2, max_length=8)
    assert [e["caption"] for e in entries] == [r.caption for r in direct]
    for e, r in zip(entries, direct, strict=True):
        assert e["attention_shape"] == [2, 2]
        np.testing.assert_allclose(e["attention"], r.attention, atol=1e-3)  # float16 in attention.npy
    from_base = captioner.caption_features([b.features for b in base], beam_size=2, max_length=8)
    assert any(not np.allclose(r.attention, s.attention, atol=1e-4) or r.caption != s.caption
               for r, s in zip(direct, from_base, strict=True))


@pytest.mark.slow
def test_the_store_is_refused_for_a_finetuned_checkpoint(shapes, finetuned, tmp_path: Path) -> None:
    """Its stored features come from the encoder before fine-tuning: evaluating on them is refused."""
    from captioning.evaluation.job import EvaluateConfig, evaluate

    with pytest.raises(ConfigError, match=r"encoder mismatch.*'settings.finetune': \{'blocks': 2\}"):
        evaluate(EvaluateConfig(ckpt_path=str(finetuned["ckpt"]), output_dir=str(tmp_path / "eval")))
