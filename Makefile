# Train Short, Test Long: build the book and run the tests.
#
#   make book    build the website into _build/html (executes every notebook)
#   make test    library tests + every chapter notebook (nbval) + browser tests
#                of the built site (when _build/html exists) + two chapters run
#                as on Colab (make colab-check)
#
# Both create or update the virtual environment $(VENV) from requirements.txt.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The torch this book is tested with; it is installed only when the venv has none.
# Any torch >= 2.1 works: `make TORCH=torch book`, or pre-install your own.
TORCH  ?= torch==2.13.0
# Running mode of the notebooks: small (seconds per model, CPU) or full (GPU).
SIZE   ?= small
SITE   := _build/html
# pytest workers: notebooks run side by side, each in its own kernel.
JOBS   ?= 2
# torch threads per worker and kernel: the cores shared out, so that JOBS
# kernels do not fight over them (oversubscribed OpenMP threads spin-wait).
THREADS ?= $(shell $(PYTHON) -c "import os; c = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; print(max(1, c // $(JOBS)))")
# Chapters that `make colab-check` runs as on Colab (file-name prefixes; empty: all),
# and the quick ones that `make test` runs that way (empty: none).
CHAPTERS ?=
COLAB_QUICK ?= 01 02
# `make test` also runs the chapters that train models on the other CPU kernel set of this machine,
# with POSENC_SEED=1 and an empty run cache (make test-evidence); `make test EVIDENCE=` skips it.
EVIDENCE ?= 1

.PHONY: all book test test-lib test-notebooks test-site test-evidence colab-check install-cells dist benchmarks gpu-kit venv clean

all: test

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# The notebooks run JOBS at a time first (book/execute.py, into the build's execution cache), then
# the website is built from the cache; a notebook that fails stops the build with its error.
book: venv
	POSENC_SIZE=$(SIZE) POSENC_STATIC=1 $(BIN)/python book/execute.py --jobs $(JOBS)
	POSENC_SIZE=$(SIZE) POSENC_STATIC=1 $(BIN)/jupyter-book build --all -W --keep-going .
	@echo "The website is in $(SITE)/index.html"

# With EVIDENCE set, the chapters that train are left to the evidence check, which runs them under nbval
# (other kernels, other seeds, empty cache); here they would only repeat what `make book` just executed.
test: venv
	OMP_NUM_THREADS=$(THREADS) POSENC_SIZE=$(SIZE) POSENC_PROGRESS=0 $(BIN)/python -m pytest tests chapters --nbval-lax -p no:cacheprovider \
		-n $(JOBS) --dist loadfile $(if $(strip $(EVIDENCE)),$$($(BIN)/python book/evidence_check.py --list | sed 's/^/--ignore=/'))
ifneq ($(strip $(COLAB_QUICK)),)
	@$(MAKE) --no-print-directory colab-check CHAPTERS="$(COLAB_QUICK)"
endif
ifneq ($(strip $(EVIDENCE)),)
	@$(MAKE) --no-print-directory test-evidence
endif

test-lib: venv
	$(BIN)/python -m pytest tests -p no:cacheprovider

test-notebooks: venv
	OMP_NUM_THREADS=$(THREADS) POSENC_SIZE=$(SIZE) POSENC_PROGRESS=0 $(BIN)/python -m pytest chapters --nbval-lax -p no:cacheprovider \
		-n $(JOBS) --dist loadfile

# The chapters that train, again on the other CPU kernel set, POSENC_SEED=1 and an empty run cache.
test-evidence: venv
	POSENC_SIZE=$(SIZE) $(BIN)/python book/evidence_check.py --jobs $(JOBS) $(CHAPTERS)

test-site: venv
	POSENC_REQUIRE_SITE=1 $(BIN)/python -m pytest tests/test_site.py -p no:cacheprovider

# Chapters as Colab runs them: a bare environment (cached in ~/.cache/posenc-colab-check),
# posenc installed by each chapter's first cell from a git clone of this checkout.
colab-check: venv
	POSENC_SIZE=$(SIZE) $(BIN)/python book/colab_check.py $(CHAPTERS)

# Write the repository URL (_config.yml, GitHub Actions, or a GitHub origin) into every chapter's first cell.
install-cells: venv
	$(BIN)/python book/install_cells.py

# Wheel and sdist of posenc in dist/, checked by twine.
dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

benchmarks: venv
	$(BIN)/python benchmarks/attention.py

# Wheels a bare CUDA machine without network lacks (its python3 has torch, not plotly or a kernel),
# for benchmarks/on_gpu.sh there: pip resolves them for that machine's Python and platform.
GPU_PYTHON ?= 3.12
gpu-kit: venv
	rm -rf .gpu-kit && mkdir -p .gpu-kit/wheels
	$(BIN)/python -m pip download -q --only-binary=:all: --python-version $(GPU_PYTHON) \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
		-d .gpu-kit/wheels "plotly==$$($(BIN)/python -c 'import plotly; print(plotly.__version__)')" \
		nbclient nbformat ipykernel ipywidgets
	du -sh .gpu-kit

clean:
	rm -rf _build .pytest_cache
