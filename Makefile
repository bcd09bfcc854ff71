# The two set-up commands of the README. Each creates the virtual environment it needs.
#   make book   build the HTML book into _build/html
#   make test   run every test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: book test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# one stamp per set of extras; reinstalls when pyproject.toml changes
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$(subst +,$(comma),$*)]"
	touch $@

comma := ,

book: $(VENV)/.installed-book
	$(BIN)/jupyter-book build . --all -W --keep-going

test: $(VENV)/.installed-test+book
	$(BIN)/python -m pytest

clean:
	rm -rf _build
