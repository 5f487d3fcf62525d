"""Count the FUSE requests each packfs daemon gets for the steps of a training job.

    python bench/mount_requests.py ARCHIVE [lowlevel mfusepy fusepy]

Mounts ARCHIVE with ``packfs mount -d`` (libfuse's debug output names every request),
then walks the tree twice, reads every file twice with a buffered ``open()`` and once
with ``buffering=0``, and runs ``ls -lR``, printing the requests each step caused.
Counts, not times: they show what the kernel serves from its caches and what still
reaches the daemon (for example the ``isatty`` IOCTL of every buffered ``open()``).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def count(archive: str, binding: str, work: Path) -> list[tuple[str, dict[str, int]]]:
    mountpoint = work / f"m-{binding}"
    mountpoint.mkdir(exist_ok=True)
    log_path = work / f"{binding}.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "packfs", "mount", "-d", "--binding", binding, archive,
                                   str(mountpoint)], stdout=log, stderr=log, cwd=REPO)
    try:
        while not os.path.ismount(mountpoint):
            if daemon.poll() is not None:
                raise SystemExit(f"{binding}: mount failed: {log_path.read_text()[-500:]}")
            time.sleep(0.01)

        def requests() -> collections.Counter:
            return collections.Counter(re.findall(r"opcode: (\w+)", log_path.read_text()))

        files: list[str] = []

        def walk() -> None:
            files.clear()
            for directory, _, names in os.walk(mountpoint):
                files.extend(os.path.join(directory, name) for name in names)

        def read_all(buffering: int) -> None:
            for path in files:
                with open(path, "rb", buffering=buffering) as f:
                    f.read()

        steps = [("os.walk, first", walk), ("os.walk, again", walk),
                 ("read every file, buffered open()", lambda: read_all(-1)),
                 ("again (warm)", lambda: read_all(-1)), ("again with buffering=0", lambda: read_all(0)),
                 ("ls -lR", lambda: subprocess.run(["ls", "-lR", str(mountpoint)], capture_output=True))]
        counted = []
        for name, step in steps:
            before = requests()
            step()
            time.sleep(0.3)  # the debug log is written asynchronously
            counted.append((name, dict(requests() - before)))
        return counted
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
        daemon.wait(20)


def main() -> int:
    archive = os.path.abspath(sys.argv[1])
    bindings = sys.argv[2:] or ["lowlevel", "mfusepy"]
    with tempfile.TemporaryDirectory() as work:
        results = {binding: count(archive, binding, Path(work)) for binding in bindings}
    print("| step | " + " | ".join(bindings) + " |")
    print("|---|" + "---|" * len(bindings))
    for i, (step, _) in enumerate(results[bindings[0]]):
        cells = [", ".join(f"{n} {k}" for k, n in sorted(results[b][i][1].items())) or "none" for b in bindings]
        print(f"| {step} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
