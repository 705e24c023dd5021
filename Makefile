# The README's two commands. Both run the idempotent set-up first (installs what is missing),
# then build. `make demo` builds a release tree in build/; `make test` builds a sanitizer tree
# (ASan + UBSan on the C code) in build-test/ and runs every test through ctest.
BUILD      ?= build
TEST_BUILD ?= build-test
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
NVCC_DIR   := $(shell command -v nvcc >/dev/null 2>&1 || echo /usr/local/cuda/bin)
export PATH := $(if $(NVCC_DIR),$(NVCC_DIR):,)$(PATH)

.PHONY: all setup build demo test test-all clean help

all: build

help:
	@echo "make demo   set up, build, and run the demo on the bundled tiny models"
	@echo "make test   set up, build with sanitizers, run every test (GPU tests skip without a GPU)"
	@echo "make build  set up and build the release tree ($(BUILD)/)"
	@echo "make clean  remove the build trees"

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)

test: setup
	@cmake -S . -B $(TEST_BUILD) -DDS_SANITIZE=ON >/dev/null
	@cmake --build $(TEST_BUILD) -j$(JOBS)
	@cd $(TEST_BUILD) && ctest --output-on-failure -LE slow -j$(JOBS)

# Everything, the slow tests included.
test-all: setup
	@cmake -S . -B $(TEST_BUILD) -DDS_SANITIZE=ON >/dev/null
	@cmake --build $(TEST_BUILD) -j$(JOBS)
	@cd $(TEST_BUILD) && ctest --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD) $(TEST_BUILD)
