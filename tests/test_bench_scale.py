"""captioning-bench scale at a tiny size: every stage's records are there and its own arithmetic
holds (bytes written and read, captions, vocabulary, the Zipf law, caption lengths).  Not timed."""

from __future__ import annotations

import argparse
import json
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_bench

import captioning_bench.scale as scale_bench
from captioning.store.feature_store import FeatureStore
from captioning_bench.scale import memory, synthetic
from captioning_bench.scale.stages import INDEX_BYTES_PER_ITEM, Scale, fit_shape

ITEMS, EVAL, GRID, DIM, BATCH, STEPS, WRITE_ITEMS = 48, 8, 2, 8, 8, 3, 300
TOTAL, ITEM_BYTES = ITEMS + 2 * EVAL, GRID * GRID * DIM * 2


def _args(root: Path) -> str:
    return (f"--items {ITEMS} --eval-items {EVAL} --grid {GRID} --dim {DIM} --vocab 50 --workers 0,2 "
            f"--batch-size {BATCH} --steps {STEPS} --read-items 40 --disk-write-gb 0.01 --keep-free-gb 0 "
            f"--memory-items 20 --skip decoder,memory,ddp,extract --eval-metrics bleu,cider --root {root} "
            f"--write-items {WRITE_ITEMS} --write-repeats 2")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict[str, list[dict]], Path]:
    """One run of every stage but the decoder step, the memory probes (new processes, tested in
    process below), DDP and extraction; and its work folder."""
    root = tmp_path_factory.mktemp("scale")
    out: dict[str, list[dict]] = {}
    for r in run_bench("scale", _args(root)):
        out.setdefault(r["name"], []).append(r)
    return out, root


@pytest.fixture(scope="module")
def records(run) -> dict[str, list[dict]]:
    return run[0]


def test_every_stage_reports(records) -> None:
    for name in ("disk_sequential_write", "store_build", "store_write", "store_write_copied", "split_file", "random_read_limit", "annotations/read",
                 "annotations/vocabulary", "annotations/total", "transfer_limit", "loader", "evaluate/decode",
                 "evaluate/score", "evaluate/total"):
        assert f"scale/{name}" in records, name
    for rs in records.values():
        for r in rs:
            assert r["items"] == TOTAL and r["shape"] == f"{GRID}x{GRID}x{DIM}" and r["item_bytes"] == ITEM_BYTES
            assert {"cores", "ram_gb", "disk_free_gb"} <= set(r["machine"])
            if isinstance(r.get("limit"), (int, float)) and "ratio" in r:
                assert r["ratio"] == pytest.approx(r["value"] / r["limit"], rel=1e-2, abs=1e-3)


def test_store_bytes_are_items_times_item_size(records) -> None:
    w = records["scale/store_build"][0]
    assert w["expected_data_bytes"] == TOTAL * ITEM_BYTES
    assert w["shards"] == -(-TOTAL // synthetic.SHARD_SIZE)
    assert w["data_bytes"] - w["expected_data_bytes"] == w["shards"] * 128  # one .npy header per shard
    assert 0 < w["index_bytes"] <= TOTAL * INDEX_BYTES_PER_ITEM


def test_the_writer_and_the_plain_write_write_the_same_bytes(records) -> None:
    """Each round writes the store's shards (a header each) and the plain write the same byte count; the
    figure is the round of the median ratio, its ratio the plain write's time over the store's."""
    for name, key, speed in (("store_write", "ratio", "store_mb_per_s"), ("store_write_copied", "copied_ratio",
                                                                          "copied_mb_per_s")):
        (r,) = records[f"scale/{name}"]
        assert len(r["rounds"]) == 2 and r["filesystem"] != "" and r["write_items"] == WRITE_ITEMS
        shards = -(-WRITE_ITEMS // synthetic.SHARD_SIZE)
        assert all(x["data_bytes"] == WRITE_ITEMS * ITEM_BYTES + shards * 128 for x in r["rounds"])
        median = sorted(r["rounds"], key=lambda x: x[key])[1]
        assert (r["value"], r["limit"], r["ratio"]) == (median[speed], median["plain_mb_per_s"], median[key])
        # the ratio is rounded to 3 decimals (write._ratio): a slow round's 0.011 is 0.0108 of the speeds
        assert r["ratio"] == pytest.approx(r["value"] / r["limit"], rel=0.02, abs=1e-3)
        assert all(x["cpu_ratio"] is None or x["cpu_ratio"] > 0 for x in r["rounds"])


def test_bytes_read_are_items_read_times_item_size(records) -> None:
    for r in records["scale/random_read_limit"]:
        assert r["blocks"] == 40 and r["bytes"] == 40 * ITEM_BYTES
        assert r["cache"] == "warm" or r["resident_after_evict"] == 0.0  # really cold
    loaders = records["scale/loader"]
    assert {(r["workers"], r["cache"]) for r in loaders} == {(w, c) for w in (0, 2) for c in ("cold", "warm")}
    for r in loaders:
        assert r["samples"] == (STEPS - 1) * BATCH and r["bytes"] == r["samples"] * ITEM_BYTES
        assert r["limit"] == min(r["transfer_limit"], r["random_read_limit"])


def test_captions_follow_cocos_lengths_and_a_zipf_law(records) -> None:
    f = records["scale/split_file"][0]
    assert f["captions"] == TOTAL * 5 and (f["train"], f["val"], f["test"]) == (ITEMS, EVAL, EVAL)
    assert 9.5 <= f["mean_length"] <= 11.5 and f["min_length"] >= 6 and f["max_length"] <= 22
    assert 6 <= f["top1_over_top10"] <= 16  # 10 expected: P(r) ~ 1/r
    a = records["scale/annotations/read"][0]
    assert a["captions"] == TOTAL * 5 and a["train_captions"] == ITEMS * 5 and a["vocabulary"] <= 50 + 4


def test_evaluation_records(records) -> None:
    total = records["scale/evaluate/total"][0]
    steps = {r["name"][len("scale/evaluate/"):] for rs in records.values() for r in rs
             if r["name"].startswith("scale/evaluate/")}
    assert total["eval_items"] == EVAL and total["longest_step"] in steps and "score" != total["longest_step"]
    decode, write = (records[f"scale/evaluate/{k}"][0]["value"] for k in ("decode", "write"))
    # the records give seconds to 0.01: the ratio of the unrounded times lies within their rounding
    half = 0.005
    low, high = max(write - half, 0.0) / (decode + half), (write + half) / max(decode - half, 1e-9)
    assert low - 1e-4 <= total["write_over_decode"] <= high + 1e-4 and total["precision"] == "fp32"
    parts = [records[f"scale/evaluate/score/{m}"][0]["value"] for m in ("tokenize", "ngrams", "bleu", "cider")]
    assert sum(parts) == pytest.approx(records["scale/evaluate/score"][0]["value"], abs=0.05)


def test_the_small_store_is_whole_shards_of_the_full_one(run) -> None:
    _, root = run
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    scale_bench.add_arguments(parser)
    scale = Scale.prepare(parser.parse_args(_args(root).split()))
    store, annotations, n = scale._small()
    assert n == min(TOTAL, synthetic.SHARD_SIZE)  # 20 items asked: the whole first shard
    assert len(FeatureStore.open(store)) == n
    assert len(json.loads(annotations.read_text())["images"]) == n


def test_the_memory_probe_reads_what_it_says(run) -> None:
    _, root = run
    base = ["--store", str(root / "store"), "--annotations", str(root / "annotations" / "dataset_coco.json"),
            "--workers", "0", "--batch-size", str(BATCH)]
    parser = argparse.ArgumentParser()
    for flag, kind, default in (("--store", str, None), ("--annotations", str, None), ("--workers", int, 0),
                                ("--batches", int, 0), ("--batch-size", int, BATCH), ("--rank", int, 0),
                                ("--world", int, 1)):
        parser.add_argument(flag, type=kind, default=default)
    one, loader = memory.probe(parser.parse_args([*base, "--batches", "2"]))
    assert one["samples"] == 2 * BATCH and one["feature_bytes"] == 2 * BATCH * ITEM_BYTES
    assert one["store_rss_total_mb"] == 0.0 and one["pss_total_mb"] > 0 and one["main"]["VmHWM"] > 0
    rank, loader = memory.probe(parser.parse_args([*base, "--world", "2", "--rank", "1"]))  # one epoch
    assert rank["samples"] == ITEMS * 5 // 2  # its half of the training captions


@pytest.mark.slow
def test_memory_and_ddp_stages_in_new_processes(run) -> None:
    _, root = run
    argv = _args(root).replace("--skip decoder,memory,ddp,extract",
                               "--skip build,disk,annotations,decoder,loader,evaluate,extract")
    records: dict[str, dict] = {r["name"]: r for r in run_bench("scale", argv + " --memory-batches 2 --ddp-batches 2")}
    for name in ("peak_rss_main", "pss_total", "uss_workers", "store_mapped"):
        r = records[f"scale/memory/{name}"]
        assert r["items_small"] == min(TOTAL, synthetic.SHARD_SIZE) and r["samples_small"] == r["samples_full"] == 2 * BATCH
    assert records["scale/memory/store_mapped"]["value"] == 0.0
    ddp = records["scale/ddp_pss"]
    assert ddp["world"] == 2 and [r["feature_mb"] for r in ddp["ranks"]] == [round(2 * BATCH * ITEM_BYTES / 2**20, 1)] * 2
    assert ddp["store_rss_sum"] == 0.0 and ddp["value"] == pytest.approx(sum(r["pss"] for r in ddp["ranks"]), abs=0.2)


def test_mapped_counts_the_touched_pages_of_files_under_a_folder(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    data = tmp_path / "d" / "x.bin"
    data.write_bytes(bytes(64 * 4096))
    with open(data, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        sum(m[k * 4096] for k in range(0, 64, 2))  # 32 pages touched
        got = memory.mapped(os.getpid(), tmp_path / "d")
        m.close()
    assert 32 * 4096 / 2**20 <= got["store_rss"] <= 64 * 4096 / 2**20  # fault-around may map neighbours
    assert memory.mapped(os.getpid(), tmp_path / "elsewhere") == {"store_rss": 0.0, "store_pss": 0.0}


def test_a_store_too_big_for_the_disk_halves_the_grid_then_the_dim() -> None:
    coco = 113287 + 2 * 5000
    assert fit_shape(coco, 14, 512, 60e9) == (14, 512)  # 24.7 GB
    assert fit_shape(coco, 14, 2048, 60e9) == (7, 2048)  # 99 GB does not fit; 7x7x2048 is 24.7 GB
    assert fit_shape(coco, 1, 2048, 60e9) == (1, 2048)
    assert fit_shape(1000, 1, 2048, 1000 * (1024 * 2 + INDEX_BYTES_PER_ITEM)) == (1, 1024)


def test_zipf_words_and_lengths() -> None:
    assert len({synthetic.word(r) for r in range(10000)}) == 10000 and synthetic.word(0) == "wa"
    p = synthetic.zipf_probabilities(10000)
    assert p.sum() == pytest.approx(1.0) and p[0] / p[9] == pytest.approx(10.0)
    captions, counts = synthetic.draw_captions(4000, 100, seed=1)
    lengths = np.array([len(c) for c in captions])
    assert set(lengths) <= set(synthetic.COCO_LENGTHS) and counts.sum() == lengths.sum()
    assert synthetic.split_of(100, 10).tolist().count(2) == 10
