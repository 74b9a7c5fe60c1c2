"""Build script for hpcmtl: the Cython kernels are compiled against NumPy.

Set ``HPCMTL_DEBUG_KERNELS=1`` to compile with bounds checking and wraparound
turned on (for a debug test run); the default build turns them off.
"""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

DEBUG = os.environ.get("HPCMTL_DEBUG_KERNELS", "0") == "1"

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": True,
    "initializedcheck": DEBUG,
    "nonecheck": False,
}

extensions = [
    Extension(
        "hpcmtl._kernels",
        ["hpcmtl/_kernels.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"] if not DEBUG else ["-O0", "-g"],
    )
]

setup(
    name="hpcmtl",
    version="0.1.0",
    description="MPI-native multi-task learning: DMTRL, joint-sparse MTL, graph task kernels, online multitask learning",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(include=["hpcmtl", "hpcmtl.*"]),
    package_data={"hpcmtl": ["_kernels.pyx", "templates/*"]},
    ext_modules=cythonize(extensions, compiler_directives=directives),
    python_requires=">=3.9",
    install_requires=[
        "numpy>=1.23",
        "scipy>=1.9",
        "h5py>=3.7",
        "mpi4py>=3.1",
        "scikit-learn>=1.2",
    ],
    extras_require={
        "mpi": ["mpich"],
        "test": ["pytest>=7", "liblinear-official"],
        "plot": ["matplotlib>=3.5"],
    },
    entry_points={"console_scripts": ["hpcmtl=hpcmtl.cli:main"]},
    zip_safe=False,
)
