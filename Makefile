# The two commands: `make demo` and `make test`. Both install what is missing
# (scripts/setup.sh), configure and build; plain `make` only builds.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
PYTHON ?= /usr/bin/python3
CMAKE_FLAGS ?=

.PHONY: all setup build demo test test-cpp test-python test-asan clean

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
	$(MAKE) test-cpp test-python test-asan

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The Python package (build/python/rpa) against its reference, numpy and torch.
test-python:
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q tests/python

# The whole C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRPA_SANITIZE=address,undefined -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target rpa_tests
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
