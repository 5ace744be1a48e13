# Every target creates or reuses the project's virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv test test-fast train lint docs docs-serve bench clean

# One line per stage: pip itself is quiet (-q), but the first install takes minutes. The
# distribution was called `stratify` before it became stratify-fl (and the package index's
# `stratify` is an unrelated library): either would shadow this checkout's package, so the
# set-up removes it.
$(STAMP): setup.cfg pyproject.toml
	@test -x $(VENV)/bin/python || { \
		echo "make: creating the virtual environment $(VENV) ($(PYTHON) -m venv)"; \
		$(PYTHON) -m venv $(VENV); }
	@if $(VENV)/bin/pip show -q stratify 2>/dev/null; then \
		echo "make: removing the distribution \`stratify' from $(VENV)"; \
		$(VENV)/bin/pip uninstall --disable-pip-version-check -q -y stratify; fi
	@echo "make: installing stratify-fl from this checkout with its test extra into $(VENV):" \
		"torch, torchvision, TenSEAL, Flower, Ray, river, Opacus, pytest, ... (a few GB;" \
		"about 5-6 minutes the first time, seconds when $(VENV) has them already)"
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[test]'
	@touch $(STAMP)
	@echo "make: $(VENV) is ready"

venv: $(STAMP)

# the whole suite (CI's), recording every test's seconds: tests/tiers.py derives the slow
# list that test-fast leaves out from that record (docs/development.md, "Tests").
# pytest-xdist runs it on WORKERS processes (default: one more than the cores, since many
# tests wait on processes they start; WORKERS=0 runs it in this one process), each test
# file whole on one worker, as its module fixtures expect
DURATIONS := build/test-durations.txt
WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1)")

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests -n $(WORKERS) --dist loadfile --durations-file $(DURATIONS)

# the developer's loop: the tests not marked slow, one case per method of the method-wide
# parametrisations (tests/conftest.py)
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q -m "not slow"

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

# the manual served on http://127.0.0.1:8000, rebuilt on every edit: the site's search
# only works when served (build/site opened as files has none)
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) *.egg-info build
