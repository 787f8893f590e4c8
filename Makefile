# stof — plain Makefile. `make` builds into build/; see README.md.
CUDA    ?= /usr/local/cuda
PREFIX  ?= /usr/local
CC      ?= gcc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -Wall -Wextra -Werror=implicit-function-declaration
# Includes name their room: "base/json.h", "gpu/jit.h" (under src/), "cache/cache.h",
# "codegen/render.h", "tools/workload.h" (under the top); "stof.h" and "ctx.h" are src/'s own.
CPPFLAGS = -std=c11 -D_GNU_SOURCE -Isrc -I. -Ibuild/gen -I$(CUDA)/include
LIBS     = -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lnvrtc -lsqlite3 -ldl -lm -lpthread
# hiredis (the Redis tier, cache/remote.c) is linked statically, into
# libstof.so too, with its symbols kept inside: the GPU machine has no
# hiredis. Without its header and static library, stof is built with the
# tier left out (STOF_REMOTE_CACHE then says so); HIREDIS=no forces that.
HASH := \#
ifeq ($(origin HIREDIS),undefined)
HIREDIS := $(shell printf '$(HASH)include <hiredis/hiredis.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && \
             f=$$($(CC) -print-file-name=libhiredis.a) && test -f "$$f" && echo "$$f")
endif
ifneq ($(filter /%,$(HIREDIS)),)
CPPFLAGS += -DSTOF_HAVE_HIREDIS
LIBS     := $(HIREDIS) $(LIBS)
SO_HIDE   = -Wl,--exclude-libs,libhiredis.a
endif
# Check and subunit are linked statically: the GPU machine has neither.
CHECK_LIBS = -Wl,-Bstatic -lcheck -lsubunit -Wl,-Bdynamic -lrt
SAN      = -fsanitize=address,undefined -fno-omit-frame-pointer
# Fuzzing (tests/fuzz/): `make fuzz` runs each target this long, with clang's
# libFuzzer where it links (else the plain driver); `make test` replays the corpus.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS = json workload mask cache
FUZZ_CC  ?= clang
FUZZ_FLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all

PY_INCLUDE := $(shell python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_NATIVE   = $(if $(wildcard $(PY_INCLUDE)/Python.h),build/_native.abi3.so)

LIB_SRC  = $(wildcard src/*.c src/*/*.c codegen/*.c cache/*.c)
LIB_SRC := $(filter-out codegen/embed.c,$(LIB_SRC))
LIB_OBJ  = $(LIB_SRC:%.c=build/obj/%.o) build/obj/gen/templates.o
SAN_OBJ  = $(LIB_SRC:%.c=build/asan/%.o) build/asan/gen/templates.o
FUZZ_OBJ = $(LIB_SRC:%.c=build/fuzzobj/%.o) build/fuzzobj/gen/templates.o
TEMPLATES = $(sort $(wildcard templates/*.cu templates/*.cuh))
TEST_SRC = $(wildcard tests/test_*.c tests/*/test_*.c)
TOOLS    = build/stof-dump build/stof-warm build/stof-demo build/stof-demo-attn
BENCHES  = $(patsubst bench/%.c,build/%,$(wildcard bench/*.c))

.PHONY: all test test-python demo bench install clean sanitize fuzz fuzz-replay gpu-check floors
all: build/libstof.a build/libstof.so $(TOOLS) build/stof-tests $(BENCHES) build/floors.ok $(PY_NATIVE)

# The Python package's launch calls without ctypes (python/stof/_native.c,
# on the stable ABI: one file for CPython 3.8 and later), built where
# Python's headers are; without it the package launches through ctypes.
build/_native.abi3.so: python/stof/_native.c
	$(CC) $(CFLAGS) $(WARN) -I$(PY_INCLUDE) -shared -fPIC -o $@ $<

build/gen/templates.c: $(TEMPLATES) build/embed
	@mkdir -p $(@D)
	build/embed $(TEMPLATES) > $@

build/embed: codegen/embed.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $<

# What the objects were built with: when it changes (a library found or lost,
# another CUDA, other flags), build/config.stamp changes and every object is
# rebuilt; otherwise it keeps its time and nothing is.
CONFIG_LINE = $(CC) | $(CPPFLAGS) | $(CFLAGS) | $(WARN) | $(LIBS)
build/config.stamp: FORCE
	@mkdir -p $(@D)
	@printf '%s\n' '$(CONFIG_LINE)' | cmp -s - $@ || printf '%s\n' '$(CONFIG_LINE)' > $@
FORCE:

build/obj/%.o: %.c build/config.stamp
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -fPIC -MMD -MP -c -o $@ $<
build/obj/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -c -o $@ $<
build/asan/%.o: %.c build/config.stamp
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(SAN) -MMD -MP -c -o $@ $<
build/asan/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(SAN) -c -o $@ $<

# The floors (tools/floors.sh): no file includes or calls a room of a higher
# floor or another room of its own, and no module reaches itself again; the
# build fails on a breach.
FLOOR_SRC = $(wildcard src/*.[ch] src/*/*.[ch] cache/*.[ch] codegen/*.[ch] tools/*.[ch] \
                       bench/*.[ch] tests/*.[ch] tests/*/*.[ch])
build/floors.ok: tools/floors.sh $(FLOOR_SRC) $(LIB_OBJ)
	bash tools/floors.sh $(filter-out build/obj/gen/%,$(LIB_OBJ))
	@touch $@
floors: build/floors.ok

# libstof.a carries hiredis's objects (appended, never replacing a member of
# the same name), so that a static link needs no hiredis of its own.
build/libstof.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
ifneq ($(filter /%,$(HIREDIS)),)
	rm -rf build/hiredis-obj && mkdir -p build/hiredis-obj && cd build/hiredis-obj && \
	  ar x $(HIREDIS) && ar qc ../libstof.a *.o && ranlib ../libstof.a
endif
build/libstof.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libstof.so.0 $(SO_HIDE) -o $@ $^ $(LIBS)

# tools/workload.c reads workload files for stof-warm, the layer benchmark and the tests;
# tools/workload_line.c the command line's one-line cases.
WORKLOAD_OBJ = tools/workload.o tools/workload_line.o
build/stof-%: tools/%.c build/libstof.a
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $< $(filter %.o,$^) build/libstof.a $(LIBS)
# tools/cli.c: every tool's command line. stof-dump's commands are modules of
# their own (tools/dump_*.c); its mask command holds shapes to stof.h's limits.
DUMP_OBJ = $(patsubst %.c,%.o,$(wildcard tools/dump_*.c)) tools/cli.o $(WORKLOAD_OBJ)
build/stof-dump: $(addprefix build/obj/,$(DUMP_OBJ))
build/stof-warm: $(WORKLOAD_OBJ:%=build/obj/%) build/obj/tools/cli.o
build/stof-demo build/stof-demo-attn: build/obj/tools/cli.o

build/bench_%: bench/bench_%.c build/libstof.a
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $< $(filter %.o,$^) build/libstof.a $(LIBS)
build/bench_layer: $(WORKLOAD_OBJ:%=build/obj/%)
build/bench_plan: $(WORKLOAD_OBJ:%=build/obj/%)

# The runner finds suites by file name: tests/test_X.c defines suite_X().
build/gen/suites.inc: $(TEST_SRC)
	@mkdir -p $(@D)
	for f in $(TEST_SRC); do n=$$(basename $$f .c); n=$${n#test_}; \
	  case $$n in gpu_*) echo "GPU_SUITE($$n)";; *) echo "SUITE($$n)";; esac; done > $@

# The CLI suites run the built tools: keep them current.
build/stof-tests: tests/run.c $(TEST_SRC) tests/testutil.h build/gen/suites.inc build/libstof.a $(WORKLOAD_OBJ:%=build/obj/%) $(TOOLS)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(WARN) -o $@ tests/run.c $(TEST_SRC) $(WORKLOAD_OBJ:%=build/obj/%) build/libstof.a $(CHECK_LIBS) $(LIBS)

build/asan/stof-tests: tests/run.c $(TEST_SRC) tests/testutil.h build/gen/suites.inc $(SAN_OBJ) $(WORKLOAD_OBJ:%=build/asan/%)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(WARN) $(SAN) -o $@ tests/run.c $(TEST_SRC) $(WORKLOAD_OBJ:%=build/asan/%) $(SAN_OBJ) $(CHECK_LIBS) $(LIBS)

build/asan/stof-%: tools/%.c $(SAN_OBJ)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(SAN) -o $@ $< $(filter %.o,$^) $(LIBS)
build/asan/stof-dump: $(addprefix build/asan/,$(DUMP_OBJ))
build/asan/stof-warm: $(WORKLOAD_OBJ:%=build/asan/%) build/asan/tools/cli.o
build/asan/stof-demo build/asan/stof-demo-attn: build/asan/tools/cli.o

# Fuzz targets with the plain driver (gcc, ASan and UBSan): the corpus replay.
# The workload target reads through tools/workload.c, as stof-warm does.
build/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/driver.c tests/fuzz/fuzz.h $(SAN_OBJ) $(WORKLOAD_OBJ:%=build/asan/%)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/fuzz $(CFLAGS) $(WARN) $(SAN) -o $@ $< tests/fuzz/driver.c $(WORKLOAD_OBJ:%=build/asan/%) $(SAN_OBJ) $(LIBS)

# ... and with libFuzzer (clang), on objects built for its coverage.
build/fuzzobj/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<
build/fuzzobj/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) -O1 -c -o $@ $<
build/fuzz/libfuzzer_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_OBJ) $(WORKLOAD_OBJ:%=build/fuzzobj/%)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) -Itests/fuzz $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(WORKLOAD_OBJ:%=build/fuzzobj/%) $(FUZZ_OBJ) $(LIBS)

# `make test` first checks what it needs (tools/deps.sh: installed with
# apt-get as root, else the command is printed), then builds, replays the
# fuzz corpus (its ASan objects built on every CPU when make was given no -j,
# as .ci/run runs it), runs the C suites (several side by side: tests/run.c,
# STOF_TEST_JOBS) and the Python suites.
NPROC := $(shell nproc 2>/dev/null || echo 1)
JOBS   = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(NPROC))
test:
	@bash tools/deps.sh test
	@$(MAKE) --no-print-directory $(JOBS) all
	@$(MAKE) --no-print-directory $(JOBS) fuzz-replay
	STOF_BUILD=build build/stof-tests
	$(MAKE) --no-print-directory test-python

# Every fuzz target over its corpus (tests/corpus/TARGET), under ASan and UBSan.
fuzz-replay: $(FUZZ_TARGETS:%=build/fuzz/replay_%)
	@for t in $(FUZZ_TARGETS); do \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 FUZZ_ARTIFACTS=build/fuzz \
	    build/fuzz/replay_$$t tests/corpus/$$t || exit 1; done

# The Python package's suites (stdlib unittest): CPU ones everywhere, GPU ones
# where torch sees a GPU.
test-python: build/libstof.so $(TOOLS) $(PY_NATIVE)
	@if command -v python3 >/dev/null; then STOF_LIB=build/libstof.so python3 python/tests/run.py; \
	 else echo "python tests left out: no python3"; fi

# test_render runs $STOF_BUILD/embed.
build/asan/embed: codegen/embed.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(SAN) -o $@ $<

sanitize: build/asan/stof-tests build/asan/embed $(TOOLS:build/%=build/asan/%)
	STOF_BUILD=build/asan STOF_TEST_KERNELS=build/test-kernels ASAN_OPTIONS=detect_leaks=1 \
	    UBSAN_OPTIONS=halt_on_error=1 build/asan/stof-tests

fuzz:
	@bash tools/fuzz.sh $(FUZZ_SECONDS)

demo:
	@bash tools/deps.sh demo
	@$(MAKE) --no-print-directory $(JOBS) all
	@bash tools/demo.sh

bench: all
	@bash tools/gpu-check.sh bench

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 build/libstof.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 build/libstof.so $(DESTDIR)$(PREFIX)/lib/libstof.so.0
	ln -sf libstof.so.0 $(DESTDIR)$(PREFIX)/lib/libstof.so
	install -m 644 src/stof.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 build/stof-dump build/stof-warm $(DESTDIR)$(PREFIX)/bin/
	for pc in stof stof-static; do \
	  sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@CUDA@|$(CUDA)|g' $$pc.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$pc.pc; done
	@# Programs find libstof.so.0 through the rpath stof.pc gives them; ldconfig
	@# also lists it where the loader looks by default.
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then \
	  ldconfig $(PREFIX)/lib 2>/dev/null || true; fi

clean:
	rm -rf build

-include $(shell find build/obj build/asan build/fuzzobj -name '*.d' 2>/dev/null)
