# captioning: two commands to know: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# The CPU-usable torch pair this project is tested with (any torch>=2.1 works), and the torchcodec
# built for that torch (torchcodec releases follow torch's; it needs FFmpeg's libraries: .ci/run).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1 torchcodec==0.17.0

.PHONY: install demo test test-fast reproduce reproduce-report lint bench gpu-wheels gpu-check clean data strip-notebooks

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_PINS)
	$(PIP) install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## make demo: the README's pipeline commands on synthetic data -> features -> train -> evaluate -> captions +
## heatmaps (CPU); prints its time, the install included
demo:
	@start=$$(date +%s); $(MAKE) --no-print-directory install && $(PY) -m captioning.demo && \
	  echo "make demo: $$(( $$(date +%s) - start )) s in all, the install included"

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

## make reproduce: the papers' claims on the embedded data (conf/reproduce/): the development protocol
## (data seed 0), then the confirmation on fresh data seeds; each run leaves its record in
## docs/results/runs/ and is never repeated; the reports land in docs/results/ (hours on 2 CPU cores)
reproduce: $(STAMP)
	$(PY) -m captioning_reproduce --protocol development
	$(PY) -m captioning_reproduce --protocol confirmation

## make reproduce-report: the reports from the committed records only (runs nothing)
reproduce-report: $(STAMP)
	$(PY) -m captioning_reproduce --protocol development --report
	$(PY) -m captioning_reproduce --protocol confirmation --report

lint: $(STAMP)
	$(VENV)/bin/ruff check captioning captioning_bench captioning_reproduce tests

## make strip-notebooks: clear outputs before committing notebooks (a test checks they are stripped)
strip-notebooks: $(STAMP)
	$(PY) -c "import nbformat, sys; [nbformat.write(nb, p) for p in sys.argv[1:] for nb in [nbformat.read(p, as_version=4)] if [c.update(outputs=[], execution_count=None) for c in nb.cells if c.cell_type == 'code'] is not None]" notebooks/*.ipynb

bench: $(STAMP)
	$(VENV)/bin/captioning-bench train --device cpu --steps 10
	$(VENV)/bin/captioning-bench beam --device cpu --repeats 3
	$(VENV)/bin/captioning-bench metrics --device cpu

## make gpu-wheels (here, with PyPI): .whl/, the wheels a bare GPU machine lacks (~35 MiB). make gpu-check
## (on a CUDA machine, two calls of < 5 min): the GPU tests, benchmarks and CLIs of training, then of
## extraction -> gpu-check/{train,extract}/figures.jsonl (scripts/gpu_check.sh: the device tool's calls
## are in its header)
GPU_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_CHECK_OUT ?= gpu-check
gpu-wheels:
	PYTHON=$(GPU_PY) bash scripts/gpu_wheels.sh
gpu-check:
	rc=0; for call in train extract; do \
	  PYTHON=$(GPU_PY) bash scripts/gpu_check.sh $$call $(GPU_CHECK_OUT)/$$call || rc=$$?; done; exit $$rc

clean:
	rm -rf outputs multirun results .pytest_cache
