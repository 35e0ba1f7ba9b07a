# Two commands do everything on a fresh machine:
#   make demo   - run the main job on the embedded Gemma 3 270M (no GPU, no keys, no network)
#   make test   - run the test suite
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first and pinned, so that pip never swaps in another build later:
# PyPI gives the right build per platform (CUDA on Linux GPU boxes, MPS on Apple silicon).
# For a CPU-only Linux machine without a local wheel, add the CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup demo test lint server clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" $(TORCH_INDEX_ARG)
	$(BIN)/python -m pip install --quiet -e ".[server,notebook,dev]"
	# checkov (Kubernetes policy scan) pins old packaging/networkx: it gets its own venv.
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/python -m pip install --quiet checkov==3.3.30
	ln -sf ../checkov/bin/checkov $(BIN)/checkov
	touch $@

demo: setup
	$(BIN)/python -m autoresearch run autoresearch/configs/demo_study.yaml

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

server: setup
	$(BIN)/python -m server

clean:
	rm -rf $(VENV)
