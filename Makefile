# packfs: `make demo` and `make test` work on a fresh Debian machine (as root, or with
# the system packages already installed).

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# The C format library (no FUSE, no Python), its Python glue and the FUSE daemon's.
C_SOURCES := $(wildcard packfs/cformat/*.[ch] packfs/cpython/*.[ch] packfs/cdaemon/*.[ch])
# nginx: the HTTP server the remote-source tests start on loopback (tests/remote_servers.py
# runs its own, as the user, on a free port; the system's service is not used), and openssl
# to make its https certificate.
SYSTEM_PACKAGES := fuse3 libfuse2 nginx openssl
# What pip needs to build packfs's C extensions: _sigbus, which keeps readers alive when
# an archive is overwritten in place, and _lowlevel, the compiled mount daemon (libfuse3's
# headers, found by pkg-config, and zlib's).  Optional: without them (and not root) the
# install goes on without them; packfs falls back to its pure-Python checks and daemon.
BUILD_PACKAGES := gcc python3-dev libfuse3-dev pkg-config zlib1g-dev libzstd-dev

.PHONY: setup system-packages build-packages apt-build-packages man test typecheck test-lowest demo bench bench-tools fuzz soak clean install-mount-helper fuzz-packages fuzz-c fuzz-c-tsan fuzz-c-coverage

# packfs(1), generated from the CLI's own help (packfs/manpage.py) into the venv, where
# man(1) finds it while the venv's bin is on PATH (man-db looks beside each PATH entry
# for share/man); otherwise: man -l .venv/share/man/man1/packfs.1.  Rebuilt whenever
# the CLI changes.
MANDIR  ?= $(VENV)/share/man/man1
MANPAGE := $(MANDIR)/packfs.1

setup: system-packages build-packages $(STAMP) $(MANPAGE)

man: $(MANPAGE)

$(MANPAGE): $(wildcard packfs/cli/*.py) packfs/manpage.py packfs/__init__.py | $(STAMP)
	@mkdir -p $(MANDIR)
	$(PY) -m packfs.manpage > $@.tmp && mv $@.tmp $@

# Installs the Debian packages in $(1) that are missing (as root; otherwise says how).
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing (run as root, or: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi
endef

# FUSE's runtime pieces for `packfs mount` (fusermount3, libfuse3, libfuse.so.2).
system-packages:
	$(call apt_install,$(SYSTEM_PACKAGES))

# A C compiler and Python's headers, for packfs._sigbus: installed as root, only named
# otherwise (a venv's Python may bring its own headers, as pyenv's does).
build-packages:
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory apt-build-packages; \
	else missing=""; for p in $(BUILD_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; [ -z "$$missing" ] || echo "note: without$$missing the optional C extension packfs._sigbus may not build"; fi

apt-build-packages:
	$(call apt_install,$(BUILD_PACKAGES))

# torch first, pinned to the CPU build these machines carry (pip's find-links): asked
# for unpinned, pip would fetch the newest build with gigabytes of CUDA packages.
# Elsewhere: make TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

$(STAMP): pyproject.toml setup.py packfs/_sigbus.c packfs/_sigbus.h $(C_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	@# setuptools announces every editable install with a 10-line notice; it is not a problem.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e ".[test,demo,dev]"
	@$(PY) -c "import packfs._sigbus" 2>/dev/null || echo "note: packfs._sigbus was not built (no C compiler or Python headers?): packfs works, but an archive overwritten in place can kill its readers"
	@$(PY) -c "import packfs._lowlevel" 2>/dev/null || echo "note: packfs._lowlevel was not built (no libfuse3-dev, pkg-config or zlib1g-dev?): packfs mount uses the slower Python daemon"
	touch $(STAMP)

# The suite runs twice, once on each daemon: on the newest Python with the compiled
# daemon (packfs mount's default), then on the lowest Python packfs declares with the
# Python daemon (make test-lowest), so both daemons and both ends of the declared range
# pass every test.  Each pass runs TEST_WORKERS pytest processes (pytest-xdist), a test
# file to a process: tests wait on servers, daemons and child processes, so two
# processes keep two cores busy.  TEST_WORKERS=0 runs one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# The slowest tests of each pass are listed at its end: where CI's time goes.
DURATIONS := --durations=25

test: setup
	@$(MAKE) --no-print-directory typecheck
	$(PY) -m pytest -rs $(XDIST) $(DURATIONS) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-lowest

# Types checked (mypy, the dev extra, which make setup installs) over core, source, write
# and fuse: the first step of make test (about 25 s cold, 13 s warm here: its cache is in the
# venv), before the suite.  The pip line serves a venv made before setup installed it.
typecheck: setup
	@$(PY) -c "import mypy" 2>/dev/null || PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e ".[dev]"
	$(PY) -m mypy -p packfs.core -p packfs.source -p packfs.write -p packfs.fuse

# The lowest Python of pyproject's requires-python (3.9): pyenv's, as these machines
# carry it (Debian 12 has no 3.9 package, and PyPI no interpreter), or any python3.9 on
# PATH, or LOWEST_PYTHON=/path/to/python3.9.  Its own venv, with every extra but torch
# (PyPI's torch for 3.9 is a CUDA build of several GB, and no CPU build is on PyPI);
# the torch tests run in the main pass.  Without such a Python it says so and runs the
# mount tests on the Python daemon with the newest Python; under CI, where the declared
# range must be tested, that is a failure.
LOWEST_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.9.*/bin/python3.9) $(shell command -v python3.9 2>/dev/null))
LOWEST_VENV   ?= .venv-lowest
LOWEST_STAMP  := $(LOWEST_VENV)/.installed

test-lowest: system-packages build-packages
	@if [ -z "$(LOWEST_PYTHON)" ]; then \
	  echo "no Python 3.9 found (pyenv install 3.9, or LOWEST_PYTHON=/path/to/python3.9): the lowest declared Python is not tested"; \
	  if [ "$$CI" = true ]; then exit 1; fi; \
	  PACKFS_TEST_BINDING=mfusepy $(PY) -m pytest -rs -m fuse -q $(XDIST) $(PYTEST_ARGS); \
	else $(MAKE) --no-print-directory $(LOWEST_STAMP) && \
	  echo "the suite on $$($(LOWEST_VENV)/bin/python --version), the lowest Python packfs declares, mounting with the Python daemon:" && \
	  PACKFS_TEST_BINDING=mfusepy PACKFS_TEST_WITHOUT_EXTRAS=torch $(LOWEST_VENV)/bin/python -m pytest -rs -q -p no:cacheprovider $(XDIST) $(DURATIONS) $(PYTEST_ARGS); \
	fi

$(LOWEST_STAMP): pyproject.toml setup.py packfs/_sigbus.c packfs/_sigbus.h $(C_SOURCES)
	$(LOWEST_PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(LOWEST_VENV)/bin/python -m pip install -q -e ".[fsspec,demo,remote,dask]" \
	  "pytest>=7.3" "pytest-xdist>=3.3" "pandas>=1.5" "pillow>=9" "moto[server]>=5" "boto3>=1.26"
	touch $(LOWEST_STAMP)

demo: setup
	$(PY) demo/demo.py

# Long runs of what the tests run briefly: damaged and hostile archives (at least
# 100,000 cases), and a mount under mixed hostile load for minutes.  Both print counts.
FUZZ_CASES ?= 100000
SOAK_SECONDS ?= 300

fuzz: setup
	$(PY) -m tests.fuzz --cases $(FUZZ_CASES)

soak: setup
	$(PY) -m tests.soak --seconds $(SOAK_SECONDS)

# The C format library alone (packfs/cformat/, fuzz/format_fuzz.c) and the compiled
# daemon (packfs._lowlevel: packfs/cformat/, cpython/ and cdaemon/, fuzz/lowlevel_fuzz.c)
# fuzzed by libFuzzer under AddressSanitizer and UBSan, and the daemon's concurrent
# read path under ThreadSanitizer
# (fuzz/lowlevel_tsan.c); both print their counts.  `make fuzz-c` first replays every
# past finding (tests/fuzz_c/), then fuzzes for FUZZ_C_SECONDS from the seeds (made from
# the test suite's archives) and the corpus it keeps in fuzz/build/corpus; a finding is
# saved in fuzz/build/findings and fails the target.  `make fuzz-c-coverage` gives the
# line coverage of those C files over the corpus.  They embed the venv's CPython (the Tree
# type's constructor checks what the daemon is given) and need clang 14, its sanitizer
# runtimes and llvm-cov (Debian 12's), installed as root.
FUZZ_PACKAGES := clang-14 libclang-rt-14-dev llvm-14
FUZZ_CC ?= clang-14
FUZZ_BUILD ?= fuzz/build
FUZZ_C_SECONDS ?= 60
FUZZ_C_TSAN_SECONDS ?= 60
FUZZ_C_THREADS ?= 4
FUZZ_REGRESSIONS := tests/fuzz_c
FUZZ_CFLAGS := -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
FUZZ_DEPENDS := fuzz/daemon.h fuzz/build_flags.py $(C_SOURCES) packfs/_sigbus.h | $(STAMP) fuzz-packages
# The venv's Python headers and libpython, libfuse3's flags; fuzz/build_flags.py says what is missing.
FUZZ_LINK = flags="$$($(PY) fuzz/build_flags.py)" && $(FUZZ_CC) $(FUZZ_CFLAGS)

fuzz-packages:
	$(call apt_install,$(FUZZ_PACKAGES))

$(FUZZ_BUILD)/lowlevel-fuzz: fuzz/lowlevel_fuzz.c $(FUZZ_DEPENDS)
	@mkdir -p $(@D)
	$(FUZZ_LINK) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $< -o $@ $$flags

# The format library alone (fuzz/format_fuzz.c): no libfuse, no Python, no stubs.
FORMAT_SOURCES := $(wildcard packfs/cformat/*.c)
$(FUZZ_BUILD)/format-fuzz: fuzz/format_fuzz.c fuzz/layout.h $(wildcard packfs/cformat/*.[ch]) | fuzz-packages
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  $< $(FORMAT_SOURCES) -o $@ -lz -lzstd

$(FUZZ_BUILD)/lowlevel-tsan: fuzz/lowlevel_tsan.c $(FUZZ_DEPENDS)
	@mkdir -p $(@D)
	$(FUZZ_LINK) -fsanitize=thread $< -o $@ $$flags

$(FUZZ_BUILD)/lowlevel-coverage: fuzz/lowlevel_fuzz.c $(FUZZ_DEPENDS)
	@mkdir -p $(@D)
	$(FUZZ_LINK) -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping $< -o $@ $$flags

$(FUZZ_BUILD)/seeds/.made: fuzz/seeds.py tests/fuzz.py tests/hostile.py tests/deep_tables.py tests/codec_archives.py | $(STAMP)
	rm -rf $(@D)
	$(PY) fuzz/seeds.py $(@D)
	touch $@

# FUZZ_C_SECONDS in all: a third for the format library alone, the rest for the daemon.
FUZZ_C_FORMAT_SECONDS = $(shell expr $(FUZZ_C_SECONDS) / 3)

fuzz-c: setup $(FUZZ_BUILD)/lowlevel-fuzz $(FUZZ_BUILD)/format-fuzz $(FUZZ_BUILD)/seeds/.made
	$(PY) fuzz/campaign.py fuzz --binary $(FUZZ_BUILD)/format-fuzz --seconds $(FUZZ_C_FORMAT_SECONDS) \
	  --corpus $(FUZZ_BUILD)/format-corpus --seeds $(FUZZ_BUILD)/seeds --findings $(FUZZ_BUILD)/format-findings \
	  --regressions $(FUZZ_REGRESSIONS)
	$(PY) fuzz/campaign.py fuzz --binary $(FUZZ_BUILD)/lowlevel-fuzz \
	  --seconds $(shell expr $(FUZZ_C_SECONDS) - $(FUZZ_C_FORMAT_SECONDS)) \
	  --corpus $(FUZZ_BUILD)/corpus --seeds $(FUZZ_BUILD)/seeds --findings $(FUZZ_BUILD)/findings \
	  --regressions $(FUZZ_REGRESSIONS)

fuzz-c-tsan: setup $(FUZZ_BUILD)/lowlevel-tsan $(FUZZ_BUILD)/seeds/.made
	$(PY) fuzz/campaign.py tsan --binary $(FUZZ_BUILD)/lowlevel-tsan --seconds $(FUZZ_C_TSAN_SECONDS) \
	  --threads $(FUZZ_C_THREADS) --log $(FUZZ_BUILD)/tsan.log $(FUZZ_BUILD)/seeds $(FUZZ_REGRESSIONS) \
	  $(wildcard $(FUZZ_BUILD)/corpus)

fuzz-c-coverage: setup $(FUZZ_BUILD)/lowlevel-coverage $(FUZZ_BUILD)/seeds/.made
	$(PY) fuzz/campaign.py coverage --binary $(FUZZ_BUILD)/lowlevel-coverage --source $(filter %.c,$(C_SOURCES)) \
	  --work $(FUZZ_BUILD)/coverage $(FUZZ_BUILD)/seeds $(FUZZ_REGRESSIONS) $(wildcard $(FUZZ_BUILD)/corpus)

clean:
	rm -rf $(VENV) $(LOWEST_VENV) demo-data .pytest_cache $(FUZZ_BUILD)

# The alternatives the benchmarks compare against: squashfs (mksquashfs, for pack and
# bench/pack_parallel.py) + squashfuse from Debian,
# ratarmount from PyPI in a venv of its own (so its dependencies never meet ours).
BENCH_PACKAGES := squashfs-tools squashfuse erofs-utils zstd
RATARMOUNT_VENV := bench/.ratarmount-venv

bench-tools:
	$(call apt_install,$(BENCH_PACKAGES))
	@test -x $(RATARMOUNT_VENV)/bin/ratarmount || { \
	  $(PYTHON) -m venv $(RATARMOUNT_VENV) && $(RATARMOUNT_VENV)/bin/pip install -q ratarmount; }

bench: setup bench-tools
	$(PY) bench/core.py $(CORE_ARGS)
	$(PY) bench/compare.py $(BENCH_ARGS)
	$(PY) bench/dataloader.py $(DATALOADER_ARGS)
	$(PY) bench/pack_parallel.py $(PACK_PARALLEL_ARGS)

# mount(8) runs /sbin/mount.fuse.packfs for `mount -t fuse.packfs ARCHIVE DIR` and for
# fstab lines of type fuse.packfs (as root).  The helper runs this checkout's venv, so
# nothing needs to be on root's PATH at boot.  Example fstab line:
#   /data/train.ffr  /mnt/train  fuse.packfs  ro,allow_other,nofail  0  0
MOUNT_HELPER ?= /sbin/mount.fuse.packfs

install-mount-helper: setup
	$(PY) -c "from packfs.mount import helper_script; import os; print(helper_script(os.path.abspath('$(PY)')), end='')" > $(MOUNT_HELPER)
	chmod 755 $(MOUNT_HELPER)
