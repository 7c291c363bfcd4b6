# `make run` starts the explorer, `make test` runs the whole suite; both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
# No NVIDIA driver: pin the CPU torch (an unpinned one pulls a multi-GB CUDA build). GPU users keep theirs.
CONSTRAINTS := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints-cpu.txt)
PORT ?= 8501

.PHONY: run test bench browser clean

$(VENV)/.deps: requirements.txt constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt $(CONSTRAINTS)
	touch $@

$(VENV)/.dev: $(VENV)/.deps requirements-dev.txt
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt $(CONSTRAINTS)
	touch $@

# Headless Chromium renders PNG exports (kaleido) and drives the browser tests. Installed when we are
# root on Debian/Ubuntu; elsewhere PNG export reports that it needs Chromium and browser tests skip.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "could not install chromium: PNG export and browser tests will be unavailable"; fi

run: $(VENV)/.deps browser
	$(PY) -m streamlit run app.py --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

# two workers (pytest-xdist), a file each at a time: the suite is CPU-bound and CI has 2 cores
test: $(VENV)/.dev browser
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(VENV)/.dev
	for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
