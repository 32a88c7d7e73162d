# The two commands: `make demo` and `make test`. Both install what is missing
# (scripts/setup.sh), configure and build; plain `make` only builds.
BUILD ?= build
# One clang build with ASan + UBSan holds the C++ suite and the fuzzers
# (`make test-asan`, `make test-fuzz`, `make fuzz`): one compile of the
# library under the sanitizers instead of two.
SAN_BUILD ?= build-san
ARM_BUILD ?= build-arm
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
PYTHON ?= /usr/bin/python3
CMAKE_FLAGS ?=
# Fuzzing (docs/robustness.md): seconds per fuzzer for `make fuzz`.
FUZZ_SECONDS ?= 60
FUZZ_FLAGS ?=
FUZZ_WORK_CORPUS ?= $(SAN_BUILD)/corpus
# `make test` replays a fixed stretch of each fuzzer (seed 1, TEST_FUZZ_RUNS
# inputs, capped at TEST_FUZZ_SECONDS): the same inputs on every machine, so
# CI fails only on a bug the developer's own run would have hit too.
# Open-ended search is `make fuzz`.
TEST_FUZZ_RUNS ?= 20000
TEST_FUZZ_SECONDS ?= 120
FUZZERS := ragged_attention_fuzzer paged_attention_fuzzer kv_write_fuzzer mla_fuzzer
# The threaded kernel and the concurrency tests under ThreadSanitizer.
TSAN_FILTER ?= Kernel*:Plan*:ThreadPool*:WorkerIdleHooks*:Concurrency*
# The sanitizer builds compile the Highway code for the baseline
# and the best target of this CPU only (the release build's tests cover every
# target): a third fewer kernel objects to build under them, and the target
# that dispatches here is the one they check (AVX2 on a CPU without AVX-512:
# with AVX3 listed there they ran SSE4 alone, which hid F12 of
# docs/robustness.md).
SAN_BEST_X86 = $(if $(shell grep -m1 -ow avx512bw /proc/cpuinfo 2>/dev/null),AVX3,AVX2)
SAN_HWY_TARGETS ?= $(if $(filter x86_64,$(shell uname -m)),SSE4;$(SAN_BEST_X86),NEON)
# The sanitizer builds at -O1 with line tables only (what a sanitizer's
# report needs): they compile in half the time of -O2 -g.
SAN_FLAGS ?= -O1 -g1 -DNDEBUG
# `make test-package`: the pip package and the CMake package as a user gets
# them, in a throwaway tree. The pip build's own CMake tree (build/pip) is
# kept between runs, so only the first run compiles the library again.
PKG_BUILD ?= $(BUILD)/package
# `make install PREFIX=...` (default: CMAKE_INSTALL_PREFIX, /usr/local).
PREFIX ?=

.PHONY: all setup build install demo test test-cpp test-python test-package test-asan test-tsan \
	test-fuzz fuzz san-build check-arm test-arm clean

all: build

setup:
	@./scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Headers, librpa.a, rpaConfig.cmake (rpa::rpa), rpa.pc, the `rpa` command.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

demo: setup
	$(MAKE) build
	./$(BUILD)/rpa demo

# Each step prints how long it took, so a slow one shows in CI's log.
TEST_STEPS := build test-cpp test-python test-package test-asan test-tsan test-fuzz
test: setup
	@for step in $(TEST_STEPS); do \
	  start=$$(date +%s); $(MAKE) --no-print-directory $$step || exit 1; \
	  echo "make test: $$step took $$(( $$(date +%s) - start )) s"; \
	done

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The Python package (build/python/rpa) against its reference, numpy and torch.
test-python:
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q tests/python

# The packages, installed as a user installs them:
# (a) pip: a wheel, then `pip install .` into a throwaway venv; `python -m rpa`
#     (a verified example) and every Python test, torch ops included, run
#     against the installed package from a directory outside the clone; then
#     `pip uninstall` must remove it;
# (b) C++: `cmake --install` of $(BUILD) into a prefix, and
#     examples/consumer built against it with find_package(rpa) and with
#     pkg-config, and run (it verifies a small attention result).
PKG_VENV = $(abspath $(PKG_BUILD))/venv
PKG_HWY_TARGETS = $(shell sed -n 's/^RPA_HWY_TARGETS:STRING=//p' $(BUILD)/CMakeCache.txt)
test-package: build
	rm -rf $(PKG_BUILD)
	$(PYTHON) -m venv --system-site-packages $(PKG_VENV)
	RPA_CMAKE_ARGS='-DRPA_HWY_TARGETS=$(PKG_HWY_TARGETS)' CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PKG_VENV)/bin/pip wheel -q --no-build-isolation --no-index --no-deps -w $(PKG_BUILD)/dist .
	RPA_CMAKE_ARGS='-DRPA_HWY_TARGETS=$(PKG_HWY_TARGETS)' CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PKG_VENV)/bin/pip install -q --no-build-isolation --no-index .
	@set -e; outside=$$(mktemp -d); trap 'rm -rf "$$outside"' EXIT; cd "$$outside"; \
	  echo "test-package: in $$outside"; \
	  $(PKG_VENV)/bin/python -m rpa; \
	  RPA_TEST_INSTALLED=1 $(PKG_VENV)/bin/python -m pytest -q -p no:cacheprovider $(CURDIR)/tests/python; \
	  $(PKG_VENV)/bin/pip uninstall -q -y rpa; \
	  if $(PKG_VENV)/bin/python -c "import rpa" 2>/dev/null; then \
	    echo "test-package: rpa still importable after pip uninstall"; exit 1; fi; \
	  $(PKG_VENV)/bin/pip install -q --no-index --no-deps $(abspath $(PKG_BUILD))/dist/rpa-*.whl; \
	  $(PKG_VENV)/bin/python -c "import rpa, torch; print('test-package: wheel', rpa.__version__, \
	    torch.ops.rpa.ragged_paged_attention.default.name())"
	cmake --install $(BUILD) --prefix $(PKG_BUILD)/prefix > /dev/null
	cmake -S examples/consumer -B $(PKG_BUILD)/consumer -DCMAKE_PREFIX_PATH=$(abspath $(PKG_BUILD))/prefix \
	  > /dev/null
	cmake --build $(PKG_BUILD)/consumer -j $(JOBS) > /dev/null
	./$(PKG_BUILD)/consumer/rpa_consumer
	./examples/consumer/build_with_pkg_config.sh $(PKG_BUILD)/prefix $(PKG_BUILD)/consumer-pkg-config

# The AddressSanitizer + UndefinedBehaviorSanitizer build (clang: libFuzzer
# is clang's): rpa_tests, the `rpa` command and the libFuzzer targets, all
# with fuzzer coverage (-DRPA_FUZZ=ON). RPA_SANITIZE keeps oneDNN out of it.
san-build:
	CC=clang CXX=clang++ cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_FUZZ=ON -DRPA_SANITIZE=address,undefined '-DRPA_HWY_TARGETS=$(SAN_HWY_TARGETS)' \
	  '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)' '-DCMAKE_C_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)' \
	  -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(SAN_BUILD) -j $(JOBS) --target rpa_tests rpa_cli $(FUZZERS)

# The whole C++ suite again under ASan + UBSan (tests/lsan.supp: a system
# library's leak, not rpa's): the `rpa` command's tests (ctest label cli)
# and rpa_tests as JOBS gtest shards, one process each (a process per test,
# as ctest runs them, spends more time starting ASan than testing).
test-asan: san-build
	cd $(SAN_BUILD) && LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --output-on-failure -j $(JOBS) -L cli
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ./scripts/run_gtest_shards.sh $(SAN_BUILD)/tests/rpa_tests $(JOBS)

# The threaded kernel and the concurrency tests under ThreadSanitizer.
test-tsan:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_SANITIZE=thread '-DRPA_HWY_TARGETS=$(SAN_HWY_TARGETS)' \
	  '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)' '-DCMAKE_C_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)' \
	  -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target rpa_tests
	TSAN_OPTIONS=halt_on_error=1 ./$(TSAN_BUILD)/tests/rpa_tests --gtest_filter='$(TSAN_FILTER)'

# The library's sources compiled for aarch64 with the cross compiler (installed
# if missing): it builds for Arm. Not part of `make test`.
check-arm: build
	./scripts/check_arm.sh $(BUILD)

# The C++ tests cross-built for aarch64 (cmake/aarch64-linux-gnu.cmake) and
# run under qemu-user on Highway's NEON target (scripts/test_arm.sh; installs
# the cross compiler, qemu-user-static and the arm64 packages if missing).
# Not in `make test` (its build would push it past 20 minutes): .ci/run runs
# it after.
test-arm:
	./scripts/test_arm.sh $(ARM_BUILD) $(JOBS)

# The libFuzzer targets (the sanitizer build's): each runs FUZZ_SECONDS from
# its seed corpus (fuzz/corpus/<fuzzer>) and stops make on any finding.
fuzz: setup san-build
	@$(MAKE) --no-print-directory -O -j $(JOBS) $(addprefix fuzz-run-,$(FUZZERS))

# One fuzzer; `fuzz` runs JOBS of them side by side.
fuzz-run-%:
	@mkdir -p $(FUZZ_WORK_CORPUS)/$* $(SAN_BUILD)/findings
	@echo "fuzz: $* for $(FUZZ_SECONDS) s"
	@./$(SAN_BUILD)/fuzz/$* -max_total_time=$(FUZZ_SECONDS) \
	    $(FUZZ_FLAGS) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	    -artifact_prefix=$(SAN_BUILD)/findings/$*- \
	    $(FUZZ_WORK_CORPUS)/$* fuzz/corpus/$* > $(SAN_BUILD)/findings/$*.log 2>&1 \
	  || { grep -v '^#[0-9]' $(SAN_BUILD)/findings/$*.log | tail -n 60; \
	       echo "fuzz: $* found a bug; input in $(SAN_BUILD)/findings"; exit 1; }
	@grep '^stat::\|^Done\|cov:' $(SAN_BUILD)/findings/$*.log | tail -n 4

# A bounded, reproducible run of every fuzzer, part of `make test`.
# It starts from the committed corpus alone, never from what earlier runs grew.
test-fuzz:
	rm -rf $(SAN_BUILD)/test-corpus
	$(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) FUZZ_WORK_CORPUS=$(SAN_BUILD)/test-corpus \
	  FUZZ_FLAGS="-seed=1 -runs=$(TEST_FUZZ_RUNS)"

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD) $(ARM_BUILD)
