# packfs: `make demo` and `make test` work on a fresh Debian machine (as root, or with
# the system packages already installed).

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SYSTEM_PACKAGES := fuse3 libfuse2

.PHONY: setup system-packages test demo bench clean

setup: system-packages $(STAMP)

# FUSE's runtime pieces for `packfs mount` (fusermount3, libfuse.so.2).
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
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

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,demo]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -rs $(PYTEST_ARGS)

demo: setup
	$(PY) demo/demo.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache

bench: setup
	$(PY) bench/core.py
