# The two commands: `make demo` and `make test`. Both install what is missing
# (scripts/setup.sh), configure and build; plain `make` only builds.
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
PYTHON ?= /usr/bin/python3
CMAKE_FLAGS ?=
# Fuzzing (docs/robustness.md): seconds per fuzzer for `make fuzz`.
FUZZ_SECONDS ?= 60
FUZZ_FLAGS ?=
FUZZ_WORK_CORPUS ?= $(FUZZ_BUILD)/corpus
# `make test` replays a fixed stretch of each fuzzer (seed 1, TEST_FUZZ_RUNS
# inputs, capped at TEST_FUZZ_SECONDS): the same inputs on every machine, so
# CI fails only on a bug the developer's own run would have hit too.
# Open-ended search is `make fuzz`.
TEST_FUZZ_RUNS ?= 20000
TEST_FUZZ_SECONDS ?= 120
FUZZERS := ragged_attention_fuzzer paged_attention_fuzzer kv_write_fuzzer
# The threaded kernel and the concurrency tests under ThreadSanitizer.
TSAN_FILTER ?= Kernel*:Plan*:ThreadPool*:Concurrency*

.PHONY: all setup build demo test test-cpp test-python test-asan test-tsan test-fuzz fuzz \
	fuzz-build check-arm clean

all: build

setup:
	@./scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: setup
	$(MAKE) build
	./$(BUILD)/rpa demo

test: setup
	$(MAKE) build
	$(MAKE) test-cpp test-python test-asan test-tsan test-fuzz

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The Python package (build/python/rpa) against its reference, numpy and torch.
test-python:
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q tests/python

# The whole C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_SANITIZE=address,undefined -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target rpa_tests rpa_cli
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

# The threaded kernel and the concurrency tests under ThreadSanitizer.
test-tsan:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_SANITIZE=thread -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target rpa_tests
	TSAN_OPTIONS=halt_on_error=1 ./$(TSAN_BUILD)/tests/rpa_tests --gtest_filter='$(TSAN_FILTER)'

# The library's sources compiled for aarch64 with the cross compiler (installed
# if missing): it builds for Arm. Not part of `make test`.
check-arm: build
	./scripts/check_arm.sh $(BUILD)

# libFuzzer targets with ASan+UBSan (clang): each runs FUZZ_SECONDS from its
# seed corpus (fuzz/corpus/<fuzzer>) and stops make on any finding.
fuzz-build:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_FUZZ=ON -DRPA_BUILD_TESTS=OFF -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZERS)

fuzz: setup fuzz-build
	@set -e; for f in $(FUZZERS); do \
	  mkdir -p $(FUZZ_WORK_CORPUS)/$$f $(FUZZ_BUILD)/findings; \
	  echo "fuzz: $$f for $(FUZZ_SECONDS) s"; \
	  ./$(FUZZ_BUILD)/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) \
	    $(FUZZ_FLAGS) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/findings/$$f- \
	    $(FUZZ_WORK_CORPUS)/$$f fuzz/corpus/$$f > $(FUZZ_BUILD)/findings/$$f.log 2>&1 \
	    || { grep -v '^#[0-9]' $(FUZZ_BUILD)/findings/$$f.log | tail -n 60; \
	         echo "fuzz: $$f found a bug; input in $(FUZZ_BUILD)/findings"; exit 1; }; \
	  grep '^stat::\|^Done\|cov:' $(FUZZ_BUILD)/findings/$$f.log | tail -n 4; \
	done

# A bounded, reproducible run of every fuzzer, part of `make test`.
# It starts from the committed corpus alone, never from what earlier runs grew.
test-fuzz:
	rm -rf $(FUZZ_BUILD)/test-corpus
	$(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) FUZZ_WORK_CORPUS=$(FUZZ_BUILD)/test-corpus \
	  FUZZ_FLAGS="-seed=1 -runs=$(TEST_FUZZ_RUNS)"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
