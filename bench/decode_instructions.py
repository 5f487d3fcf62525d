"""Instructions per ``PackedFolder.read`` of a small file, counted by valgrind's
callgrind: a figure that a loaded machine does not move (wall time on a shared CPU
drifts by half), for comparing two trees' read paths side by side.

    python bench/decode_instructions.py --work /tmp/packfs-bench-compression [--repo ../main]

``--work`` is bench/compression_reads.py's work directory (its ``small-text`` tree and
the three archives of it: uncompressed, ``--compress zstd`` and with ``--dictionary
auto``).  For each archive, a child Python (this one's interpreter, importing the
packfs of ``--repo``, by default this checkout) opens it, reads 50 files to warm up and
then 2,000 shuffled files ``--passes`` times, under callgrind; the same with no pass is
subtracted, so what remains is the reads alone.  CPU placement does not matter to the
count.  Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ARCHIVES = {"uncompressed": "small-text.ffr", "--compress zstd": "small-text-zstd.ffr",
            "--compress zstd --dictionary auto": "small-text-dict.ffr"}
FILES = 2000

CHILD = """
import os, random, sys
sys.path.insert(0, sys.argv[1])
import packfs
source, archive, passes = sys.argv[2], sys.argv[3], int(sys.argv[4])
paths = sorted(os.path.relpath(os.path.join(d, f), source) for d, _, fs in os.walk(source)
               for f in fs if not f.startswith("."))
random.Random(0).shuffle(paths)
paths = paths[:%d]
read = packfs.PackedFolder(archive).read
for p in paths[:50]:
    read(p)
for _ in range(passes):
    for p in paths:
        read(p)
""" % FILES


def instructions(repo: Path, work: Path, archive: str, passes: int) -> int:
    """Instructions callgrind counts for a child that reads ``passes`` times."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                           CHILD, str(repo), str(work / "small-text"), str(work / archive), str(passes)],
                          capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-compression"))
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    print(f"packfs of {args.repo.resolve()}, {FILES} files x {args.passes} passes, instructions per read")
    for label, archive in ARCHIVES.items():
        if not (args.work / archive).exists():
            print(f"{label:40s} (no {args.work / archive}: run bench/compression_reads.py first)")
            continue
        base = instructions(args.repo, args.work, archive, 0)
        reads = instructions(args.repo, args.work, archive, args.passes)
        print(f"{label:40s} {(reads - base) / (FILES * args.passes) / 1000:8.1f} k")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
