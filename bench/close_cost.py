"""What a safe PackedFolder.close() costs PackedFolder.read.

close() only drops the folder's references and lets the table, the map and the
descriptor free themselves when the last in-flight call lets go (core/archive.py,
Archive.close), so the read paths are unchanged.  This measures that claim, and
what the alternative that was not chosen would have cost: a count of calls in flight,
kept under a lock, so close() could wait for it to reach zero.

    python bench/close_cost.py                   # 2,000 files of 1 KiB
    python bench/close_cost.py --files 20000 --rounds 9

Three figures, each the median of ``--rounds`` alternating runs of one read() of every
file in a shuffled order (ns per read), with ``check_data`` on and off:

- ``head``: the committed tree (``git archive HEAD``), in its own process;
- ``tree``: this working tree, in its own process, run alternately with ``head``;
- ``counted``: this tree with every read() inside a lock-protected in-flight count.

Ratios to ``head`` (for ``tree``) and to ``tree`` (for ``counted``) are what hold on a
shared machine; absolute times drift.  Other read-path edits between HEAD and the
working tree show up in ``tree`` too.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import io
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_MEASURE = r"""
import json, random, sys, threading, time
sys.path.insert(0, sys.argv[1])
import packfs
archive, check, counted = sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
folder = packfs.PackedFolder(archive, check_data=check)
paths = sorted(folder)
random.Random(0).shuffle(paths)
read = folder.read
if counted:
    lock, state = threading.Lock(), [0]
    def read(path, _read=folder.read):
        with lock:
            state[0] += 1
        try:
            return _read(path)
        finally:
            with lock:
                state[0] -= 1
for path in paths:  # warm: pages in the page cache and faulted into the map
    read(path)
best = []
for _ in range(5):
    start = time.perf_counter_ns()
    for path in paths:
        read(path)
    best.append((time.perf_counter_ns() - start) / len(paths))
print(json.dumps(min(best)))
"""


def measure(tree: Path, archive: Path, check: bool, counted: bool) -> float:
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(tree), str(archive), str(int(check)),
                             str(int(counted))], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import packfs

    with tempfile.TemporaryDirectory() as work_name:
        work = Path(work_name)
        head = work / "head"
        head.mkdir()
        archived = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "packfs"], capture_output=True,
                                  check=True).stdout
        tarfile.open(fileobj=io.BytesIO(archived)).extractall(head)
        rng = random.Random(1)
        entries = [packfs.Entry(f"d{i % 50:02d}/{i:06d}.bin", rng.randbytes(args.size)) for i in range(args.files)]
        archive = work / "bench.ffr"
        packfs.pack_entries(entries, archive)
        results = {}
        for check in (True, False):
            runs: dict[str, list[float]] = {"head": [], "tree": [], "counted": []}
            for _ in range(args.rounds):  # alternated, so drift hits all three alike
                runs["head"].append(measure(head, archive, check, False))
                runs["tree"].append(measure(REPO, archive, check, False))
                runs["counted"].append(measure(REPO, archive, check, True))
            medians = {name: statistics.median(values) for name, values in runs.items()}
            results[f"check_data={check}"] = {
                "ns_per_read": {name: round(value) for name, value in medians.items()},
                "tree/head": round(medians["tree"] / medians["head"], 3),
                "counted/tree": round(medians["counted"] / medians["tree"], 3),
            }
        print(json.dumps({"files": args.files, "size": args.size, "rounds": args.rounds, **results}, indent=2))


if __name__ == "__main__":
    main()
