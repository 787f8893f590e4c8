# stof — plain Makefile. `make` builds into build/; see README.md.
CUDA    ?= /usr/local/cuda
PREFIX  ?= /usr/local
CC      ?= gcc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -Wall -Wextra -Werror=implicit-function-declaration
CPPFLAGS = -std=c11 -D_GNU_SOURCE -Isrc -Icodegen -Icache -Ibuild/gen -I$(CUDA)/include
LIBS     = -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lnvrtc -lsqlite3 -ldl -lm -lpthread
# Check and subunit are linked statically: the GPU machine has neither.
CHECK_LIBS = -Wl,-Bstatic -lcheck -lsubunit -Wl,-Bdynamic -lrt
SAN      = -fsanitize=address,undefined -fno-omit-frame-pointer
# Fuzzing (tests/fuzz/): `make fuzz` runs each target this long, with clang's
# libFuzzer where it links (else the plain driver); `make test` replays the corpus.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS = json workload mask cache
FUZZ_CC  ?= clang
FUZZ_FLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all

LIB_SRC  = $(wildcard src/*.c codegen/*.c cache/*.c)
LIB_SRC := $(filter-out codegen/embed.c,$(LIB_SRC))
LIB_OBJ  = $(LIB_SRC:%.c=build/obj/%.o) build/obj/gen/templates.o
SAN_OBJ  = $(LIB_SRC:%.c=build/asan/%.o) build/asan/gen/templates.o
FUZZ_OBJ = $(LIB_SRC:%.c=build/fuzzobj/%.o) build/fuzzobj/gen/templates.o
TEMPLATES = $(sort $(wildcard templates/*.cu templates/*.cuh))
TEST_SRC = $(wildcard tests/test_*.c)
TOOLS    = build/stof-dump build/stof-warm build/stof-demo build/stof-demo-attn
BENCHES  = $(patsubst bench/%.c,build/%,$(wildcard bench/*.c))

.PHONY: all test test-python demo bench install clean sanitize fuzz fuzz-replay gpu-check
all: build/libstof.a build/libstof.so $(TOOLS) build/stof-tests $(BENCHES)

build/gen/templates.c: $(TEMPLATES) build/embed
	@mkdir -p $(@D)
	build/embed $(TEMPLATES) > $@

build/embed: codegen/embed.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $<

build/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -fPIC -MMD -MP -c -o $@ $<
build/obj/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -c -o $@ $<
build/asan/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(SAN) -MMD -MP -c -o $@ $<
build/asan/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(SAN) -c -o $@ $<

build/libstof.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
build/libstof.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libstof.so.0 -o $@ $^ $(LIBS)

build/stof-%: tools/%.c build/libstof.a
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $< build/libstof.a $(LIBS)

build/bench_%: bench/bench_%.c build/libstof.a
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -o $@ $< build/libstof.a $(LIBS)

# The runner finds suites by file name: tests/test_X.c defines suite_X().
build/gen/suites.inc: $(TEST_SRC)
	@mkdir -p $(@D)
	for f in $(TEST_SRC); do n=$$(basename $$f .c); n=$${n#test_}; \
	  case $$n in gpu_*) echo "GPU_SUITE($$n)";; *) echo "SUITE($$n)";; esac; done > $@

# The CLI suites run the built tools: keep them current.
build/stof-tests: tests/run.c $(TEST_SRC) tests/testutil.h build/gen/suites.inc build/libstof.a $(TOOLS)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(WARN) -o $@ tests/run.c $(TEST_SRC) build/libstof.a $(CHECK_LIBS) $(LIBS)

build/asan/stof-tests: tests/run.c $(TEST_SRC) tests/testutil.h build/gen/suites.inc $(SAN_OBJ)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(WARN) $(SAN) -o $@ tests/run.c $(TEST_SRC) $(SAN_OBJ) $(CHECK_LIBS) $(LIBS)

build/asan/stof-%: tools/%.c $(SAN_OBJ)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(SAN) -o $@ $< $(SAN_OBJ) $(LIBS)

# Fuzz targets with the plain driver (gcc, ASan and UBSan): the corpus replay.
build/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/driver.c tests/fuzz/fuzz.h $(SAN_OBJ)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/fuzz $(CFLAGS) $(WARN) $(SAN) -o $@ $< tests/fuzz/driver.c $(SAN_OBJ) $(LIBS)

# ... and with libFuzzer (clang), on objects built for its coverage.
build/fuzzobj/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<
build/fuzzobj/gen/templates.o: build/gen/templates.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) -O1 -c -o $@ $<
build/fuzz/libfuzzer_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_OBJ)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) -Itests/fuzz $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(LIBS)

test: all fuzz-replay
	STOF_BUILD=build build/stof-tests
	$(MAKE) --no-print-directory test-python

# Every fuzz target over its corpus (tests/corpus/TARGET), under ASan and UBSan.
fuzz-replay: $(FUZZ_TARGETS:%=build/fuzz/replay_%)
	@for t in $(FUZZ_TARGETS); do \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 FUZZ_ARTIFACTS=build/fuzz \
	    build/fuzz/replay_$$t tests/corpus/$$t || exit 1; done

# The Python package's suites (stdlib unittest): CPU ones everywhere, GPU ones
# where torch sees a GPU.
test-python: build/libstof.so $(TOOLS)
	@if command -v python3 >/dev/null; then STOF_LIB=build/libstof.so python3 python/tests/run.py; \
	 else echo "python tests left out: no python3"; fi

sanitize: build/asan/stof-tests $(TOOLS:build/%=build/asan/%)
	STOF_BUILD=build/asan ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 build/asan/stof-tests

fuzz:
	@bash tools/fuzz.sh $(FUZZ_SECONDS)

demo: all
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
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@CUDA@|$(CUDA)|g' stof.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/stof.pc

clean:
	rm -rf build

-include $(shell find build/obj build/asan build/fuzzobj -name '*.d' 2>/dev/null)
