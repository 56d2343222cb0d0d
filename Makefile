# Everything runs from a clean clone: `make demo` and `make test` create the venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

# constraints.txt pins every package to the versions CI runs; pyproject.toml states ranges.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/autotailor demo

test: $(STAMP)
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: is tests/ there?"; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/compile_zoo.py

clean:
	rm -rf $(VENV) autotailor-demo
