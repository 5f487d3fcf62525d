"""The compiler and linker flags of fuzz/'s programs (the Makefile's fuzz-c targets):
the running Python's headers and libpython (the programs embed it, for the Tree type's
constructor), where its standard library is, and libfuse3's and libzstd's flags as
setup.py finds them for packfs._lowlevel.

    python fuzz/build_flags.py      # one line of flags; exit 1, saying why, if one is missing
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def flags() -> str:
    """The flags, as one line (the -D value keeps its quotes: a C string literal)."""
    include = sysconfig.get_paths()["include"]
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION")
    if not (Path(include) / "Python.h").exists():
        raise SystemExit(f"no Python.h in {include} (python3-dev, or a Python built with its headers)")
    if not any(Path(libdir).glob(f"libpython{version}.so*")):
        raise SystemExit(f"no libpython{version}.so in {libdir} (libpython3-dev, or pyenv's Python built with "
                         "--enable-shared)")
    try:
        subprocess.run(["pkg-config", "--atleast-version=3.10", "fuse3"], check=True)
        fuse3 = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True, capture_output=True,
                               text=True).stdout.split()
        newer = subprocess.run(["pkg-config", "--atleast-version=3.12", "fuse3"]).returncode == 0
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("libfuse3 3.10 or later not found by pkg-config (libfuse3-dev)") from None
    try:  # format 1.5's codecs, decoded by the daemon and by the walk's own reference
        zstd = subprocess.run(["pkg-config", "--cflags", "--libs", "libzstd"], check=True, capture_output=True,
                              text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("libzstd not found by pkg-config (libzstd-dev)") from None
    words = [f"-I{include}", f'-DPACKFS_FUZZ_PYTHON_HOME="{sys.base_prefix}"', *fuse3, *zstd, "-lz",
             f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{libdir}"]
    if newer:
        words.append("-DPACKFS_FUSE_312=1")  # as setup.py builds packfs._lowlevel
    return " ".join(words)


if __name__ == "__main__":
    print(flags())
