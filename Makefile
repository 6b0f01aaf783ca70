# fa4_aot — ahead-of-time FlashAttention forward.
#   make build PTXAS=13.1   build cubins + manifest for every configuration, then the spill report;
#                           seconds when artifacts/ is up to date, else the full rebuild
#   make build PTXAS=best   per kernel, ship the best of every supported ptxas (no spill bytes, then
#                           no ptxas performance warning, then fewest LDL+STL, then fewest
#                           registers, then newest); restrict the
#                           candidates with BEST_CANDIDATES=13.0,13.1; BUILD_OUT=/tmp/dir builds
#                           there instead of artifacts/ (the shipped set is pinned to 13.1)
#                           PTXAS=12.8 needs ALLOW_ISA_REWRITE=1 (lowers the PTX .version header;
#                           warned, recorded in the manifest). Ends with a one-line verdict.
#                           Ctrl-C stops it within seconds, keeping every finished kernel.
#   make test               the fast suite: CPU tests, one real kernel built end to end (+ GPU tests
#                           when an sm_90 GPU is present)
#   make tune PTXAS_CANDIDATES=13.0,13.1,13.5
#                           pick ptxas by measured speed: assemble every sm_90a kernel with each
#                           candidate into $(TUNE_DIR) (CPU, cached), then on an sm_90 GPU time
#                           them all in one process and write each kernel's `measured` timings
#                           and choice into artifacts/manifest.json; without a GPU it prints the
#                           two commands to run on one. Then `make build PTXAS=tuned` ships them.
#   make reproducible       rebuild every kernel into a temporary folder and compare each cubin's
#                           sha256 with artifacts/manifest.json (CI runs it)
# All create and reuse the virtualenv $(VENV); no local CUDA toolkit is needed.
#
# How long, on a 2-core machine (CI's), measured: the one place that says it. The README, .ci/run
# and the tests point here; tests/test_newcomer.py checks the README and build.py's first ETA.
TEST_MINUTES := 4
FULL_REBUILD_MINUTES := 14

PTXAS ?= 13.1
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BEST_CANDIDATES ?=
PTXAS_CANDIDATES ?= 13.0,13.1,13.5
TUNE_DIR ?= build/tune
TUNE_PY ?= $(PY)
BUILD_OUT ?=
ALLOW_ISA_REWRITE ?=
BUILD_FLAGS := $(if $(BUILD_OUT),--out $(BUILD_OUT)) \
	$(if $(and $(filter best,$(PTXAS)),$(BEST_CANDIDATES)),--best-candidates $(BEST_CANDIDATES)) \
	$(if $(filter-out 0 no false,$(ALLOW_ISA_REWRITE)),--allow-isa-rewrite)

.PHONY: build test spill-report reproducible tune clean-venv

$(VENV)/.build-deps: requirements-build.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-build.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.build-deps requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

# --report: the spill report of the written manifest, then the verdict line, last.
# PTXAS is quoted so that an empty PTXAS= reaches build.py, which names it and the valid releases.
build: $(VENV)/.build-deps
	$(PY) build_tools/build.py --ptxas '$(PTXAS)' --jobs $(JOBS) --report $(BUILD_FLAGS)

spill-report: $(VENV)/.build-deps
	$(PY) build_tools/spill_report.py

reproducible: $(VENV)/.build-deps
	$(PY) build_tools/build.py --check-reproducible --jobs $(JOBS)

# The GPU half needs torch with CUDA and cuda-python (TUNE_PY: that interpreter), not cutlass.
tune: $(VENV)/.build-deps
	$(PY) build_tools/tune.py prepare --candidates '$(PTXAS_CANDIDATES)' --out $(TUNE_DIR) --jobs $(JOBS)
	@if nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.0'; then \
		$(TUNE_PY) build_tools/tune.py measure --tune-dir $(TUNE_DIR) && \
		$(PY) build_tools/tune.py apply --measured $(TUNE_DIR)/measured.json; \
	else \
		echo "make tune: no sm_90 GPU here. Carry $(TUNE_DIR) (with the tree) to an H100/H200 and run there:"; \
		echo "  python build_tools/tune.py measure --tune-dir $(TUNE_DIR)"; \
		echo "then bring $(TUNE_DIR)/measured.json back and run here:"; \
		echo "  $(PY) build_tools/tune.py apply --measured $(TUNE_DIR)/measured.json"; \
	fi

test: $(VENV)/.test-deps
	@echo "make test: the fast suite (~$(TEST_MINUTES) min on 2 cores): CPU tests, one real kernel built" \
	      "end to end, GPU tests when an H100/H200 is present. The full rebuild-and-compare of every" \
	      "kernel is 'make reproducible' (~$(FULL_REBUILD_MINUTES) min on 2 cores)."
	$(PY) -m pytest tests -q -rs --durations=5

clean-venv:
	rm -rf $(VENV)
