# The two set-up commands of the README. Each creates the virtual environment it needs.
#   make book     build the HTML book into _build/html
#   make test     run every test: unit tests, notebooks under nbval (profile ci), the book build
#                 and its check in a headless browser
# and, for authors:
#   make execute  re-execute the chapters in place with the cpu profile (commit the result)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
comma  := ,

.PHONY: book test execute clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# one stamp per set of extras; reinstalls when pyproject.toml changes
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$(subst +,$(comma),$*)]"
	touch $@

book: $(VENV)/.installed-book
	$(BIN)/jupyter-book build . --all -W --keep-going

# two workers (pytest-xdist), one test file or notebook each at a time, one thread each: the
# models are small, and two one-thread processes keep both cores of a 2-core machine busy. Files
# are handed out longest first (tests/conftest.py's SLOWEST_FIRST), not by their number of tests
test: $(VENV)/.installed-test+book
	SCALELONG_PROFILE=ci OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

execute: $(VENV)/.installed-book
	$(BIN)/python -m scalelong_edu.notebooks execute

clean:
	rm -rf _build
