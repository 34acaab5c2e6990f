"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

server/_splice.c (replay frames spliced from journal bytes) is built when a C compiler and the
Python headers are there; without them the install still succeeds and server/splice.py falls
back to the same frames in pure Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("server._splice", ["server/_splice.c"], optional=True)])
