# captioning: two commands to know: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# The CPU-usable torch pair this project is tested with (any torch>=2.1 works), and the torchcodec
# built for that torch (torchcodec releases follow torch's; it needs FFmpeg's libraries: .ci/run).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1 torchcodec==0.17.0

.PHONY: install demo test test-fast reproduce reproduce-quick reproduce-grounding reproduce-order lint bench gpu-wheels gpu-check clean data strip-notebooks

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_PINS)
	$(PIP) install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## make demo: synthetic data -> features -> train -> evaluate -> captions + heatmaps (CPU, < 15 min)
demo: $(STAMP)
	$(PY) -m captioning.demo

## make test: the whole suite, end-to-end runs included (what CI runs). One pytest worker per
## core (pytest-xdist), a test file per worker (its module fixtures are built once), one torch
## thread per worker (tests/conftest.py): most tests are single-process and leave a core idle.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

data: $(STAMP)
	$(VENV)/bin/captioning-generate dataset=shapes
	$(VENV)/bin/captioning-generate dataset=moving_shapes

## make reproduce: the seeds' claims on the synthetic data, 3 seeds per variant -> results/
reproduce: $(STAMP)
	$(PY) -m captioning.reproduce

reproduce-quick: $(STAMP)
	$(PY) -m captioning.reproduce --quick

## make reproduce-grounding: soft attention vs mean pooling on a 14x14 grid (448 px), 3 seeds x 10 epochs
reproduce-grounding: $(STAMP)
	$(PY) -m captioning.reproduce --only images --variants soft_14x14 mean_pool_14x14 --image-epochs 10 \
		--out results/reproduce-grounding

## make reproduce-order: event order with frame residuals at 96 and at 224 px (and the stride-8 stage beside
## the last), 2400 videos, 3 seeds x 6 epochs; the same runs evaluated four ways: beam 3 (results.md), + trigram
## blocking, + the checkpoint selected on val with that decoding, both (results_block_trigrams_val_selected.md)
## (~80 min on 2 cores, ~45 of them extraction: ~1.6 videos/s for the 224-px store, ~2.2 for its stride-8 stage)
ORDER_VARIANTS = temporal_residual temporal_residual_224 temporal_residual_224+layer2 mean_pool
reproduce-order: $(STAMP)
	for protocol in "" --block-trigrams --select-on-val "--block-trigrams --select-on-val"; do \
		$(PY) -m captioning.reproduce --only videos --variants $(ORDER_VARIANTS) --video-epochs 6 \
			--out results/reproduce-order $$protocol || exit 1; \
	done

lint: $(STAMP)
	$(VENV)/bin/ruff check captioning tests

## make strip-notebooks: clear outputs before committing notebooks (a test checks they are stripped)
strip-notebooks: $(STAMP)
	$(PY) -c "import nbformat, sys; [nbformat.write(nb, p) for p in sys.argv[1:] for nb in [nbformat.read(p, as_version=4)] if [c.update(outputs=[], execution_count=None) for c in nb.cells if c.cell_type == 'code'] is not None]" notebooks/*.ipynb

bench: $(STAMP)
	$(VENV)/bin/captioning-bench train --device cpu --steps 10
	$(VENV)/bin/captioning-bench beam --device cpu --repeats 3
	$(VENV)/bin/captioning-bench metrics --device cpu

## make gpu-wheels (here, with PyPI): .whl/, the wheels a bare GPU machine lacks (~35 MiB). make gpu-check
## (on a CUDA machine, < 8 min): GPU tests, cuda benchmarks, GPU training through the CLIs -> gpu-check/
## figures.jsonl (scripts/gpu_check.sh: the device tool's call is in its header)
GPU_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_CHECK_OUT ?= gpu-check
gpu-wheels:
	PYTHON=$(GPU_PY) bash scripts/gpu_wheels.sh
gpu-check:
	PYTHON=$(GPU_PY) bash scripts/gpu_check.sh $(GPU_CHECK_OUT)

clean:
	rm -rf outputs multirun results .pytest_cache
