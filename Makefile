# lockstep: the two commands a newcomer needs are `make run` and `make test`.
# Each installs missing Debian packages first (scripts/install-deps.sh), then
# configures and builds with CMake + Ninja into build/.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
NPROC ?= 2

.PHONY: all deps configure build run test test-tsan bench clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@mkdir -p $(BUILD_DIR)
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) > $(BUILD_DIR)/configure.log 2>&1 \
	  || { cat $(BUILD_DIR)/configure.log; exit 1; }
	@grep -E "^-- lockstep" $(BUILD_DIR)/configure.log || true

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)
	@echo "built: $(BUILD_DIR)/lockstep"

# The main job: a convnet trained data-parallel on Fashion-MNIST by
# $(NPROC) local processes. EPOCHS=3 make run trains longer.
EPOCHS ?= 2
run: build
	$(BUILD_DIR)/lockstep run --nproc-per-node $(NPROC) --unprefixed-rank0 -- \
	  $(BUILD_DIR)/examples/fashion_mnist --epochs $(EPOCHS) --checkpoint $(BUILD_DIR)/fashion_mnist.ckpt --fresh

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer build of the threaded parts: stores, process groups and the
# shm and tcp backends with ranks as threads of one process.
TSAN_DIR ?= build-tsan
TSAN_TESTS = store_test process_group_test collectives_sweep_test
test-tsan: deps
	@mkdir -p $(TSAN_DIR)
	@cmake -S . -B $(TSAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_TSAN=ON -DLOCKSTEP_BUILD_TOOLS=OFF > $(TSAN_DIR)/configure.log 2>&1 \
	  || { cat $(TSAN_DIR)/configure.log; exit 1; }
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target $(TSAN_TESTS)
	@cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) -R "store_test|process_group_test|Sweep.*_[234]ranks"

bench: build
	$(BUILD_DIR)/lockstep bench --op allreduce --backend tcp -np 2 -b 4 -e 64M -f 4 -n 20 -w 5 -c 1

clean:
	rm -rf $(BUILD_DIR) $(TSAN_DIR)
