"""Build script for hpcmtl: the Cython kernels are compiled against NumPy (and SciPy's LAPACK: ``_box_qp``).

Seven extension modules: ``hpcmtl._rows`` (the row interface type, ``Rows``) and
the kernels, one module a concern (``KERNELS``): ``hpcmtl._sdca`` (the workers'
SDCA steps and objective sums), ``hpcmtl._joint_terms`` (the learned-Sigma
problem's outer phases), ``hpcmtl._blockops`` (fixed-order row sums),
``hpcmtl._projections`` (l1,inf and l1 projections), ``hpcmtl._box_qp`` (the
server's box QP) and ``hpcmtl._online`` (the online tau solvers); the kernel
modules cimport ``_rows.pxd`` (and ``_random.pxd``, ``_losses.pxd``: inline
arithmetic compiled into each module that uses it).  The Cython directives are
set here, once: bounds checking off.

``HPCMTL_DEBUG_KERNELS=1`` compiles every kernel source as a separate module,
``hpcmtl.<name>_debug`` (``hpcmtl._sdca_debug``, ...), with bounds checking and
initialized-view checks on, so they never replace the optimized modules (they
use the installed ``hpcmtl._rows``; every check and row access of ``_rows.pxd``
is inline, so it is compiled into them with their directives).  Wraparound stays
off: no kernel indexes from the end on purpose, so a negative index is a bug and
must raise IndexError rather than silently read ``a[n - 1]``.  The generated C
goes to ``HPCMTL_DEBUG_CYTHON_DIR`` (default ``build/cython-debug``), never beside
the source.  The kernel tests build them themselves, once per source hash (see
``tests/conftest.py``); by hand::

    HPCMTL_DEBUG_KERNELS=1 python setup.py build_ext --build-lib build/kernels-debug/manual
"""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

DEBUG = os.environ.get("HPCMTL_DEBUG_KERNELS", "0") == "1"

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": DEBUG,
    "nonecheck": False,
    "show_performance_hints": not DEBUG,       # the debug build's checks are the point, not a hint (Cython 3.0.4+)
}


def extension(name, source):
    return Extension(
        name,
        [source],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"] if not DEBUG else ["-O0", "-g"],
    )


KERNELS = [("hpcmtl._sdca", "hpcmtl/_sdca.pyx"), ("hpcmtl._joint_terms", "hpcmtl/_joint_terms.pyx"),
           ("hpcmtl._blockops", "hpcmtl/_blockops.pyx"),
           ("hpcmtl._projections", "hpcmtl/_projections.pyx"), ("hpcmtl._box_qp", "hpcmtl/_box_qp.pyx"),
           ("hpcmtl._online", "hpcmtl/_online.pyx")]
if DEBUG:
    extensions = [extension(name + "_debug", source) for name, source in KERNELS]
else:
    extensions = [extension("hpcmtl._rows", "hpcmtl/_rows.pyx")] + [extension(n, s) for n, s in KERNELS]
cython_dir = os.environ.get("HPCMTL_DEBUG_CYTHON_DIR", os.path.join("build", "cython-debug")) if DEBUG else None

setup(
    name="hpcmtl",
    version="0.1.0",
    description="MPI-native multi-task learning: DMTRL, joint-sparse MTL, graph task kernels, online multitask learning",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(include=["hpcmtl", "hpcmtl.*"]),
    # the packages' root named explicitly: an editable install then puts the checkout on sys.path (a .pth
    # entry) instead of a meta-path finder, so `import hpcmtl` from the folder that holds a clone called
    # hpcmtl finds this regular package, not the clone's top folder as an empty namespace package
    package_dir={"": "."},
    package_data={"hpcmtl": ["_sdca.pyx", "_joint_terms.pyx", "_blockops.pyx", "_projections.pyx", "_box_qp.pyx",
                             "_online.pyx", "_rows.pyx", "_rows.pxd", "_random.pxd", "_losses.pxd", "templates/*"]},
    ext_modules=cythonize(extensions, compiler_directives=directives, build_dir=cython_dir, quiet=DEBUG),
    python_requires=">=3.9",
    install_requires=[
        "numpy>=1.24",                       # 1.23: support-algebra rows not bitwise the dense ones (test_supports)
        "scipy>=1.9",
        "h5py>=3.7",
        "mpi4py>=3.1",
        "scikit-learn>=1.6",                 # sklearn.utils.validation.validate_data, sklearn.utils.ClassifierTags
        "threadpoolctl>=3.1",
    ],
    extras_require={
        "mpi": ["mpich"],
        "test": ["pytest>=7", "liblinear-official", "hypothesis>=6.70"],
        "plot": ["matplotlib>=3.5"],
    },
    entry_points={"console_scripts": ["hpcmtl=hpcmtl.cli:main"]},
    zip_safe=False,
)
