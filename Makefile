# fa4_aot — ahead-of-time FlashAttention forward.
#   make build PTXAS=13.1   build cubins + manifest for every configuration, then the spill report
#   make build PTXAS=best   per kernel, ship the best of every supported ptxas (no spill bytes, then
#                           fewest LDL+STL, then fewest registers, then newest); restrict the
#                           candidates with BEST_CANDIDATES=13.0,13.1; BUILD_OUT=/tmp/dir builds
#                           there instead of artifacts/ (the shipped set is pinned to 13.1)
#   make test               CPU tests (+ GPU tests when an sm_90 GPU is present)
# Both create and reuse the virtualenv $(VENV); no local CUDA toolkit is needed.

PTXAS ?= 13.1
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BEST_CANDIDATES ?=
BUILD_OUT ?=
BUILD_FLAGS := $(if $(BUILD_OUT),--out $(BUILD_OUT)) \
	$(if $(and $(filter best,$(PTXAS)),$(BEST_CANDIDATES)),--best-candidates $(BEST_CANDIDATES))

.PHONY: build test spill-report reproducible clean-venv

$(VENV)/.build-deps: requirements-build.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-build.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.build-deps requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

build: $(VENV)/.build-deps
	$(PY) build_tools/build.py --ptxas $(PTXAS) --jobs $(JOBS) $(BUILD_FLAGS)
	$(PY) build_tools/spill_report.py $(if $(BUILD_OUT),--manifest $(BUILD_OUT)/manifest.json)

spill-report: $(VENV)/.build-deps
	$(PY) build_tools/spill_report.py

reproducible: $(VENV)/.build-deps
	$(PY) build_tools/build.py --check-reproducible --jobs $(JOBS)

test: $(VENV)/.test-deps
	$(PY) -m pytest tests -q -rs

clean-venv:
	rm -rf $(VENV)
