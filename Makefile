# Two commands: `make demo` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch; an unpinned torch pulls a multi-GB CUDA build. Override for GPUs: make TORCH=torch
TORCH  ?= torch==2.13.0
DEMO   ?= runs/demo

.PHONY: install corpus demo test test-fast sweep bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch by pip, which reads pip's settings (here a CPU wheel on disk and a cap on torch's version);
# the other 130 packages by uv, which fetches them side by side where pip takes one at a time
# (docs/benchmarks.md, "Bytecode and uv"), asked for the same torch so that it keeps the one
# installed; pip does it where uv cannot. No bytecode is compiled for the 20,000 files installed
# (most never imported): the bytecode of what lengthgen's commands import is written by importing
# it once, the rest by the processes that import it (`make test` below). PYTHONDONTWRITEBYTECODE,
# which some machines set, is unset for these two commands: with it every process would compile
# what it imports again, and nothing is written beside the sources that git does not ignore.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH)" uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet "$(TORCH)" -e ".[test]" \
		|| $(BIN)/python -m pip install --quiet --no-compile -e ".[test]"
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import importlib, pkgutil, lengthgen, torch._inductor.compile_fx; \
		[importlib.import_module(m.name) for m in pkgutil.walk_packages(lengthgen.__path__, 'lengthgen.') \
		 if not m.name.endswith('__main__')]"
	touch $@

# The language-modelling corpus (docs/lm.md): the Python documentation's reStructuredText sources
# from Debian's python3-doc, tokenized once into the cache. Elsewhere it says what to do and the
# rest of the install goes on: only `reproduce lm` needs it.
DOCS := $(wildcard /usr/share/doc/python3.*/html/_sources)
corpus: $(VENV)/.installed
	@if [ -z "$(DOCS)" ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-doc >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-doc >/dev/null) \
		|| echo "note: could not install python3-doc; the language-modelling corpus is missing (docs/lm.md)"; fi
	-$(BIN)/lengthgen corpus

install: $(VENV)/.installed corpus

# The CPU-scale Parity comparison of the Looped Transformers paper: looped vs ntp, one seed each,
# trained side by side (one single-thread job per core: the looped run is the longest, and a third
# job would slow it by a third), then evaluated and reported. Finished runs are kept, so an
# interrupted demo continues where it stopped. It needs the package alone, not the corpus.
demo: $(VENV)/.installed
	$(BIN)/lengthgen reproduce looped --tasks parity --arms looped,ntp --seeds 1 --workers 2 --threads 1 --out $(DEMO)
	@echo "demo report: $(DEMO)/report.md (figures beside it)"

# Every test, on every core (one worker per core; a test file's tests share a worker, so its
# module fixtures are built once; the files with slow tests go first: tests/conftest.py). CI runs this.
test: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n auto --dist loadscope --no-loadscope-reorder --durations=15

# The quick loop while editing: every test but the slow ones (runs that must learn, processes, grids).
test-fast: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n auto --dist loadscope --no-loadscope-reorder -m "not slow"

# The hostile sweep (tests/export/test_hostile_sweep.py): 116 bad inputs to export, the exported model,
# the harness, report and small grids, each judged clean, ok, traceback, hang or silent; prints the table.
sweep: install
	$(BIN)/python -m pytest -m sweep -s -q tests/export/test_hostile_sweep.py

bench: install
	$(BIN)/python benchmarks/speed/data_generation.py

clean:
	rm -rf $(VENV) runs *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
