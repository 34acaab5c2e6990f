"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

server/_splice.c (replay frames spliced from journal bytes) and journal/_verify.c (record checks
on read, with zlib's crc32) are built when a C compiler, the Python headers and zlib's headers are
there; without them the install still succeeds and the same work is done in pure Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("server._splice", ["server/_splice.c"], optional=True),
        # record checks on read (journal/record.py); links zlib for its crc32
        Extension("journal._verify", ["journal/_verify.c"], libraries=["z"], optional=True),
    ]
)
