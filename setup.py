"""Build the replay core: Cython sources in ``ext/`` become ``aisim._core.*``.

Compiler directives are set once here (``COMPILER_DIRECTIVES``).  Set
``AISIM_CYTHON_DEBUG=1`` to build with bounds, wraparound and initialisation
checks on, ``-O0 -g`` and annotated HTML; its C lives in ``build/cython-debug/`` so that the
optimised build's C (next to the sources) is never mistaken for it.  Cython and the C compiler
run one job per CPU, and Cython's C is regenerated only when a source changed.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("AISIM_CYTHON_DEBUG", "") not in ("", "0")

# The extension modules, in dependency order.  Each is ext/<name>.pyx with the .pxi files it
# includes (which module includes which: docs/architecture.md, the core's table).  ``testing``
# holds the handles used only by tests.
CORE_MODULES = ["blockpool", "hashing", "kvcache", "scheduler", "steptime", "engine", "deploy", "constants", "tracescan",
                "testing"]

COMPILER_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    # nonecheck stays off: the core's nogil methods update their own attributes.
    "nonecheck": False,
    "cdivision": not DEBUG,
    "embedsignature": True,
    # overflowcheck stays off in both builds: block hashes rely on uint64 wraparound.
}

# Identical float results on every machine: no fused multiply-add contraction.  The optimised
# build carries no debug information (-g0 overrides the -g in Python's own CFLAGS).
CFLAGS = ["-O0", "-g"] if DEBUG else ["-O3", "-g0"]
CFLAGS.append("-ffp-contract=off")


def _cython_include_dir():
    """Expose ``ext/`` as ``aisim/_core`` so ``from aisim._core.x cimport y`` resolves.

    The sources live in ``ext/`` (DESIGN.md), but cimports name the installed
    package.  A symlink in ``build/`` maps one onto the other for the compiler.
    """
    inc = os.path.join(HERE, "build", "cython-include")
    pkg = os.path.join(inc, "aisim")
    os.makedirs(pkg, exist_ok=True)
    link = os.path.join(pkg, "_core")
    target = os.path.join(HERE, "ext")
    if os.path.islink(link) and os.readlink(link) != target:
        os.unlink(link)
    if not os.path.lexists(link):
        os.symlink(target, link)
    return inc


def extensions():
    from Cython.Build import cythonize

    exts = [
        Extension(
            f"aisim._core.{name}",
            [os.path.join("ext", f"{name}.pyx")],
            extra_compile_args=CFLAGS,
        )
        for name in CORE_MODULES
    ]
    # Cython writes the C once per source change: a second install from the same tree reuses it.
    # Each build flavour has its own C (the directives differ), so switching never reuses the other's.
    return cythonize(
        exts,
        compiler_directives=COMPILER_DIRECTIVES,
        include_path=[_cython_include_dir()],
        annotate=DEBUG,
        quiet=True,
        build_dir=os.path.join("build", "cython-debug") if DEBUG else None,
        nthreads=_jobs(),
    )


def _jobs():
    """Parallel jobs for Cython and the C compiler: one per CPU (``-j N`` overrides the compiler's)."""
    return os.cpu_count() or 1


class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles the core's modules in parallel unless told otherwise."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = _jobs()


setup(ext_modules=extensions(), cmdclass={"build_ext": ParallelBuildExt})
