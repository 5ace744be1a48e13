# Every target creates or reuses the project's virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv test train lint docs bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests

train: $(STAMP)
	$(VENV)/bin/stratify train --mode single-sample --chunk 5

# mypy checks an installed copy: baselines/ and cli/ only become stratify.baselines and
# stratify.cli through setup.cfg's package_dir, which mypy cannot follow in the source tree
lint: $(STAMP)
	$(VENV)/bin/ruff check stratify baselines cli tests examples
	$(VENV)/bin/ruff format --check stratify baselines cli tests examples
	rm -rf build/typecheck
	$(VENV)/bin/pip install --disable-pip-version-check -q --no-deps \
		--target build/typecheck .
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../setup.cfg -p stratify

# the manual as a site in build/site; --strict fails on a broken link or anchor. The docs
# extra installs on first use only: the toolkit itself never needs it
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[docs]'
	touch $(DOCS_STAMP)

# the generated tables first: a stale one names the command that rewrites it
docs: $(DOCS_STAMP)
	$(VENV)/bin/python -m stratify.cli.docs_tables --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/site

clean:
	rm -rf $(VENV) *.egg-info build
