"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

server/_splice.c (replay frames spliced from journal bytes), server/_sowfold.c and _sowfold_order.c
(historical SOW queries' fold of journal bytes), server/_filterscan.c (content filters
evaluated over blocks of records), server/_publish.c (publish frames to journal records),
server/_replicate.c (replication's intake and filter over runs of records) and
journal/_verify.c (record checks on read) are built when a C compiler and the Python headers are
there; without them the install still succeeds and the same work is done in pure Python. The record checks take their crc32 from
ISA-L (Debian's libisal-dev; `./run` installs it where it can) when it links, else from zlib:
the same values, but zlib's is about eight times slower on records of a few hundred bytes.
"""

import os
import tempfile

from setuptools import Extension, setup


def _links(header: str, call: str, library: str) -> bool:
    """Whether a program that includes `header` and calls `call` compiles and links."""
    try:
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        cc = new_compiler()
        customize_compiler(cc)
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "probe.c")
            with open(src, "w") as f:
                f.write(f"#include <{header}>\nint main(void) {{ return (int){call}; }}\n")
            objects = cc.compile([src], output_dir=d)
            cc.link_executable(objects, os.path.join(d, "probe"), libraries=[library])
        return True
    except Exception:  # no compiler, no header or no library: the zlib build is the fallback
        return False


_ISAL = os.environ.get("TICKERTAPE_NO_ISAL") != "1" and _links(
    "isa-l/crc.h", "crc32_gzip_refl(0, 0, 0)", "isal"
)


RECORD_H = "journal/_record.h"  # the record layout, walk and crc every extension shares
BATCH_ROW_H = "server/_batch_row.h"  # the batch row the publish and replication intakes build


def _with_crc(name: str, source: str, depends: tuple[str, ...] = ()) -> Extension:
    """An extension that computes record crc32s: with ISA-L's when it links, else zlib's."""
    if _ISAL:
        return Extension(
            name,
            [source],
            define_macros=[("HAVE_ISAL", "1")],
            libraries=["isal"],
            depends=[RECORD_H, *depends],
            optional=True,
        )
    return Extension(name, [source], libraries=["z"], depends=[RECORD_H, *depends], optional=True)


setup(
    ext_modules=[
        Extension("server._splice", ["server/_splice.c"], depends=[RECORD_H], optional=True),
        Extension(
            "server._sowfold",
            ["server/_sowfold.c", "server/_sowfold_order.c"],
            depends=[RECORD_H, "server/_sowfold.h"],
            optional=True,
        ),
        Extension(
            "server._filterscan", ["server/_filterscan.c"], depends=[RECORD_H], optional=True
        ),
        _with_crc("journal._verify", "journal/_verify.c"),
        _with_crc("server._publish", "server/_publish.c", (BATCH_ROW_H,)),
        _with_crc("server._replicate", "server/_replicate.c", (BATCH_ROW_H,)),
    ]
)
