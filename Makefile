# The two commands a new user runs: `make demo` and `make test`.
# Both create (or reuse) .venv, install hpcmtl with its MPI, test and plot
# extras (the mpich wheel from PyPI: no system MPI needed) and compile the
# Cython kernels.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hpcmtl-installed
KERNELS := hpcmtl/_sdca.pyx hpcmtl/_joint_terms.pyx hpcmtl/_blockops.pyx hpcmtl/_projections.pyx \
           hpcmtl/_box_qp.pyx hpcmtl/_online.pyx
SOURCES := setup.py pyproject.toml hpcmtl/_rows.pxd hpcmtl/_rows.pyx hpcmtl/_random.pxd hpcmtl/_losses.pxd $(KERNELS)

.PHONY: demo test test-fast test-kernels install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install --quiet "Cython>=3.0.4" "numpy>=1.24" "scipy>=1.9"
	$(PY) -m pip install --quiet --no-build-isolation -e ".[mpi,test,plot]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m hpcmtl demo --out demo-output

# tests/ includes the kernel tests twice: on the optimized kernel modules
# (hpcmtl._sdca, ._joint_terms, ._blockops, ._projections, ._box_qp, ._online) and on their
# hpcmtl.<name>_debug twins, the same sources with bounds checks on, which the tests compile into
# build/kernels-debug/<source hash>/ the first time (HPCMTL_DEBUG_KERNELS=1, see
# setup.py); the in-place modules are never touched.
test: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q tests

# a chosen smoke set for development: the tests marked smoke (pyproject.toml), one or a few
# a module (kernels, store, formats, cluster collectives with one mpiexec -n 2 run, the serial
# DMTRL certificate, estimators, CLI, docs); `make test` runs all
test-fast: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -m smoke tests

# only the kernel tests (both builds; hypothesis, derandomized)
test-kernels: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q tests/test_kernels.py tests/test_kernel_properties.py

clean:
	rm -rf build *.egg-info hpcmtl/*.so hpcmtl/_rows.c $(KERNELS:.pyx=.c) hpcmtl/_kernels.c hpcmtl/*.html demo-output
