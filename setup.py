"""Build the optional C extensions (everything else is in pyproject.toml).

- packfs._sigbus keeps readers alive when an archive is truncated under its map.
- packfs.core._format is the C format library (packfs/cformat/) for Python's readers:
  a path's entry, stat, whole contents and many files' contents, without the GIL.  It
  needs zlib's headers, and libzstd's for format 1.5's codecs; not libfuse.
- packfs._lowlevel is the compiled, inode-based FUSE daemon on libfuse3's low-level API
  (`packfs mount --binding lowlevel`, the default where it is built).  It needs
  libfuse3's headers (3.10 or later, found by pkg-config) and zlib's, and libzstd's for
  format 1.5's codecs (without them it is built with PACKFS_NO_ZSTD and refuses such
  archives).  It is the same format library with the FUSE glue (packfs/cdaemon/).

All are ``optional=True``: where one cannot be compiled (no C compiler, no headers),
the install goes on without it; packfs then uses its pure-Python checks, and
`packfs mount` the Python daemon, saying so in one line.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig

from setuptools import Extension, setup

WARNINGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# The format library (packfs/cformat/: no FUSE, no Python) and the Python glue every
# extension that serves a Tree shares; its functions stay inside each extension.
FORMAT_SOURCES = [f"packfs/cformat/{name}.c" for name in ("table", "lookup", "records", "codecs", "forest",
                                                           "blockcache")]
FORMAT_HEADERS = [f"packfs/cformat/{name}.h" for name in ("tree", "table", "lookup", "records", "codecs", "forest",
                                                           "blockcache", "crc")]
TREE_SOURCES = [*FORMAT_SOURCES, "packfs/cpython/tree_object.c"]
TREE_HEADERS = [*FORMAT_HEADERS, "packfs/cpython/tree_object.h", "packfs/_sigbus.h"]
HIDDEN = ["-fvisibility=hidden"]


def pkg_config(package: str, minimum: str) -> dict[str, list[str]] | None:
    """Compiler and linker flags of ``package`` (at least ``minimum``), or None."""
    try:
        subprocess.run(["pkg-config", f"--atleast-version={minimum}", package], check=True, capture_output=True)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", package], check=True, capture_output=True,
                               text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"include_dirs": [f[2:] for f in flags if f.startswith("-I")],
            "library_dirs": [f[2:] for f in flags if f.startswith("-L")],
            "libraries": [f[2:] for f in flags if f.startswith("-l")]}


def zstd_flags() -> dict[str, list[str]] | None:
    """libzstd's flags: pkg-config's, else -lzstd where its header is in a standard place
    (an install without libzstd.pc), else None."""
    found = pkg_config("libzstd", "1.4.0")
    if found is not None:
        return found
    include = sysconfig.get_config_var("INCLUDEDIR") or "/usr/include"
    folders = (include, "/usr/include", "/usr/local/include")
    if any(os.path.exists(os.path.join(folder, "zstd.h")) for folder in folders):
        return {"include_dirs": [], "library_dirs": [], "libraries": ["zstd"]}
    return None


extensions = [Extension("packfs._sigbus", ["packfs/_sigbus.c"], depends=["packfs/_sigbus.h"], optional=True,
                        extra_compile_args=WARNINGS)]
# The format library for Python's readers (packfs.core._format): zlib, and libzstd for
# format 1.5's codecs where found; no libfuse, so it is built where the daemon is not.
zstd = zstd_flags()
core_format = {"include_dirs": [], "library_dirs": [], "libraries": ["z"],
               "define_macros": [] if zstd is not None else [("PACKFS_NO_ZSTD", "1")]}
for key, values in (zstd or {}).items():
    core_format[key].extend(values)
extensions.append(Extension("packfs.core._format", [*TREE_SOURCES, "packfs/cpython/_format_module.c"],
                            depends=TREE_HEADERS, optional=True, extra_compile_args=WARNINGS + HIDDEN,
                            **core_format))
fuse3 = pkg_config("fuse3", "3.10")
if fuse3 is not None:
    fuse3["libraries"].append("z")
    macros = [("PACKFS_FUSE_312", "1")] if pkg_config("fuse3", "3.12") is not None else []
    # libzstd decodes format 1.5's codecs; without it the daemon refuses such archives
    # (packfs mount then serves them with the Python daemon, saying why).
    if zstd is not None:
        for key, values in zstd.items():
            fuse3[key].extend(value for value in values if value not in fuse3[key])
    else:
        macros.append(("PACKFS_NO_ZSTD", "1"))
        print("packfs: libzstd (1.4 or later) not found by pkg-config: packfs._lowlevel is built without it and "
              "cannot serve archives with codecs (format 1.5); `packfs mount` uses the Python daemon for them")
    fuse3["define_macros"] = macros
    extensions.append(Extension("packfs._lowlevel",
                                [*TREE_SOURCES, "packfs/cdaemon/fuse_ops.c", "packfs/cdaemon/_lowlevel_module.c"],
                                depends=[*TREE_HEADERS, "packfs/cdaemon/fuse_ops.h"], optional=True,
                                extra_compile_args=WARNINGS + HIDDEN, **fuse3))
else:
    print("packfs: libfuse3 (3.10 or later) not found by pkg-config: packfs._lowlevel, the compiled "
          "mount daemon, is not built; `packfs mount` will use the Python daemon")

setup(ext_modules=extensions)
