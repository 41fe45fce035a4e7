# Two commands: `make demo` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch; an unpinned torch pulls a multi-GB CUDA build. Override for GPUs: make TORCH=torch
TORCH  ?= torch==2.13.0
DEMO   ?= runs/demo

.PHONY: install demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

# Copy with next-token prediction, RoPE vs ALiBi, 3 seeds each: train, evaluate, report.
# Runs that already have results are kept, so an interrupted demo continues.
demo: install
	@for pos in rope alibi; do for seed in 0 1 2; do \
	  run=$(DEMO)/copy-ntp-$$pos-s$$seed; \
	  [ -f $$run/eval.csv ] && continue; \
	  $(BIN)/lengthgen train experiments/core/copy-ntp.toml --set model.position=$$pos \
	    --set train.model_seed=$$seed --set train.data_seed=$$seed --out $$run --force || exit 1; \
	  $(BIN)/lengthgen eval $$run || exit 1; \
	done; done
	$(BIN)/lengthgen report $(DEMO)
	@echo "demo report: $(DEMO)/report.md (figure: $(DEMO)/accuracy_vs_length.png)"

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/data_generation.py

clean:
	rm -rf $(VENV) runs *.egg-info
