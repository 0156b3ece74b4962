# kvctl: `make test` runs every test; `make docs` regenerates generated docs.
# A private virtualenv (.venv) is created on first use: no manual step.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

docs: $(STAMP)
	$(PY) tools/update_docs.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
