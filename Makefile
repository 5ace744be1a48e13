# Every target creates or reuses the project's virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv test train lint bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests

train: $(STAMP)
	$(VENV)/bin/stratify train --mode single-sample --chunk 5

lint: $(STAMP)
	$(VENV)/bin/ruff check stratify baselines cli tests examples

clean:
	rm -rf $(VENV) *.egg-info
