# The two commands a new user runs: `make demo` and `make test`.
# Both create (or reuse) .venv, install hpcmtl with its MPI, test and plot
# extras (the mpich wheel from PyPI: no system MPI needed) and compile the
# Cython kernels.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hpcmtl-installed
SOURCES := setup.py pyproject.toml hpcmtl/_kernels.pyx

.PHONY: demo test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install --quiet "Cython>=3.0" "numpy>=1.23"
	$(PY) -m pip install --quiet --no-build-isolation -e ".[mpi,test,plot]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m hpcmtl demo --out demo-output

test: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q tests

clean:
	rm -rf build *.egg-info hpcmtl/*.so hpcmtl/_kernels.c demo-output
