"""Build the optional C extension packfs._sigbus (everything else is in pyproject.toml).

``optional=True``: where it cannot be compiled (no C compiler, no Python headers),
the install goes on without it and packfs uses its pure-Python checks instead
(packfs.container explains the difference)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("packfs._sigbus", ["packfs/_sigbus.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])])
