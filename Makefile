# lockstep: the two commands a newcomer needs are `make run` and `make test`.
# Each installs missing Debian packages first (scripts/install-deps.sh), then
# configures and builds with CMake + Ninja into build/.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
NPROC ?= 2

.PHONY: all deps configure build run test bench clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) > $(BUILD_DIR).configure.log 2>&1 \
	  || { cat $(BUILD_DIR).configure.log; exit 1; }
	@grep -E "^-- lockstep" $(BUILD_DIR).configure.log || true

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)
	@echo "built: $(BUILD_DIR)/lockstep"

# The main job: a model trained data-parallel on $(NPROC) local processes.
run: build
	$(BUILD_DIR)/lockstep run --nproc-per-node $(NPROC) -- $(BUILD_DIR)/examples/allreduce_demo

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD_DIR)/lockstep bench --op allreduce --backend tcp -np 2 -b 4 -e 64M -f 4 -n 20 -w 5 -c 1

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log
