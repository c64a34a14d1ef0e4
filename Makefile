# pagedserve — the two commands a user needs: `make run` and `make test`.
# Everything else here is what those two stand on.

BUILD      ?= build
ASAN_BUILD ?= build-asan
PORTABLE_BUILD ?= build-portable
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
SHARED     ?= $(abspath ../shared)
DEMO_MODEL ?= $(BUILD)/demo-model.gguf

# Debian 12 packages the build and the tests need.
DEB_PACKAGES = build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev \
               libopenblas-dev libuv1-dev libcmocka-dev
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build run test test-asan test-portable fuzz bench clean

all: build

# Install only what is missing, so a prepared machine never touches the network.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing missing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPAGEDSERVE_SHARED_DIR=$(SHARED)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# MODEL=path.gguf, else the shared TinyStories model, else a random-weight demo model.
# ARGS="--kv-cache-mb 512 ..." passes more server flags.
run: build
	@model="$(MODEL)"; \
	if [ -z "$$model" ] && [ -f "$(SHARED)/models/stories260K.gguf" ]; then model="$(SHARED)/models/stories260K.gguf"; fi; \
	if [ -z "$$model" ]; then \
	  [ -f "$(DEMO_MODEL)" ] || $(BUILD)/bin/mkmodel --demo -o "$(DEMO_MODEL)"; \
	  model="$(DEMO_MODEL)"; \
	  echo "NOTE: no model given and ../shared is absent: using a RANDOM-WEIGHT demo model;"; \
	  echo "      its output is gibberish. Run 'make run MODEL=/path/to/model.gguf' for real text."; \
	fi; \
	$(RUN_CMD)

# The server in the foreground on 127.0.0.1:$(PORT); Ctrl-C drains and stops it.
PORT ?= 8080
RUN_CMD = name=$$(basename "$$model" .gguf); \
	echo "Try: curl -s http://127.0.0.1:$(PORT)/v1/completions -d '{\"model\": \"$$name\", \"prompt\": \"Once upon a time\", \"max_tokens\": 48}'"; \
	exec $(BUILD)/bin/pagedserve -m "$$model" --port $(PORT) $(ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPAGEDSERVE_SANITIZE=ON -DPAGEDSERVE_SHARED_DIR=$(SHARED)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# The portable build (AVX2 baseline, what docker/ builds) with the AVX-512 kernels told
# the CPU lacks them: the AVX-512 code must still compile without -march's AVX-512,
# and the suite must pass as on a Zen 3 or client Intel CPU (the BF16 tests say SKIPPED;
# F32/F16 and int8 products take their AVX2 kernels, and the test that compares the F32
# one with its AVX-512 twin still runs where the CPU has AVX512F).
test-portable: deps
	cmake -S . -B $(PORTABLE_BUILD) -DCMAKE_BUILD_TYPE=Release -DPAGEDSERVE_NATIVE=OFF -DPAGEDSERVE_SHARED_DIR=$(SHARED)
	cmake --build $(PORTABLE_BUILD) -j $(JOBS)
	cd $(PORTABLE_BUILD) && PAGEDSERVE_NO_AVX512_F=1 PAGEDSERVE_NO_AVX512_BF16=1 PAGEDSERVE_NO_AVX512_VNNI=1 ctest --output-on-failure -j $(JOBS)

# libFuzzer harnesses (clang) for the request parser, GGUF loader, tokenizer, stop strings
# and SSE output, FUZZ_SECONDS each; see tests/fuzz/README.md.
FUZZ_SECONDS ?= 60
fuzz:
	tests/fuzz/run.sh $(FUZZ_SECONDS)

# Builds the ~110M-parameter random model and runs every workload against a server it starts
# and stops; results in $(BUILD)/bench/ (docs/benchmarks.md keeps the latest).
bench: build
	BUILD=$(BUILD) SHARED=$(SHARED) tools/bench.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(PORTABLE_BUILD)
