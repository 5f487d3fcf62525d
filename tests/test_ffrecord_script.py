"""An FFRecord training script runs on packfs with one line changed.

tests/ffrecord_scripts/train_imagenet.py is written against FFRecord (its ImageNet
example's dataset, loader and suspend/resume loop; a folder of shards from
ffrecord.utils.dump; FileWriter over a mkstemp file).  Its one FFRecord import,

    import ffrecord.torch

is replaced by

    from packfs import ffrecord

and nothing else.  A run suspended mid-epoch and resumed with set_step must see the
same batches, and end with the same weights, as an uninterrupted run; the loaders use
two workers (forked by ffrecord.torch.DataLoader; spawned by torch's own DataLoader for
the final evaluation, which pickles the dataset and its FileReader).
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_extra, time_limit

torch = require_extra("torch", "torch")

SCRIPT = Path(__file__).resolve().parent / "ffrecord_scripts" / "train_imagenet.py"
ORIGINAL_LINE = "import ffrecord.torch"
REPLACEMENT_LINE = "from packfs import ffrecord"


def switched_script(directory: Path) -> Path:
    text = SCRIPT.read_text()
    assert text.count(f"\n{ORIGINAL_LINE}\n") == 1 and "packfs" not in text
    switched = text.replace(f"\n{ORIGINAL_LINE}\n", f"\n{REPLACEMENT_LINE}\n")
    changed = [line for line in difflib.unified_diff(text.splitlines(), switched.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == [f"-{ORIGINAL_LINE}", f"+{REPLACEMENT_LINE}"]
    path = directory / SCRIPT.name
    path.write_text(switched)
    return path


def run(script: Path, work: Path, *arguments: str) -> list[dict]:
    subprocess.run([sys.executable, str(script), str(work), *arguments], cwd=script.parent, check=True, timeout=time_limit(300))
    return [json.loads(line) for line in (work / "output" / "log.jsonl").read_text().splitlines()]


def test_an_ffrecord_training_script_runs_with_only_its_import_changed(tmp_path: Path) -> None:
    script = switched_script(tmp_path)
    uninterrupted = run(script, tmp_path / "a")
    run(script, tmp_path / "b", "--suspend-at", "1", "4")  # suspended after step 4 of epoch 1
    resumed = run(script, tmp_path / "b")  # the same log, appended to

    steps = [record for record in uninterrupted if "step" in record]
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, s) for e in range(3) for s in range(15)]
    assert resumed == uninterrupted  # every batch, loss and accuracy, in the same order
    # Each epoch's DistributedSampler order, every training sample once per epoch.
    for epoch in range(3):
        sums = sorted(x for r in steps if r["epoch"] == epoch for x in r["sums"])
        assert len(sums) == 120
    assert sorted(x for r in steps if r["epoch"] == 0 for x in r["sums"]) == \
        sorted(x for r in steps if r["epoch"] == 1 for x in r["sums"])
    assert [r["sums"] for r in steps if r["epoch"] == 0] != [r["sums"] for r in steps if r["epoch"] == 1]
    final = [r for r in uninterrupted if r.get("epoch") == "final"]
    assert len(final) == 1 and final[0]["acc"] == [r for r in uninterrupted if r.get("epoch") == 2 and "acc" in r][0]["acc"]
    assert uninterrupted[-1]["version"].startswith("1.4.0+packfs.") and uninterrupted[-1]["readers"] == 1

    a = torch.load(tmp_path / "a" / "output" / "latest.pt", map_location="cpu")
    b = torch.load(tmp_path / "b" / "output" / "latest.pt", map_location="cpu")
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) == (3, 0)
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    # The shards ffrecord.utils.dump wrote, read back as one sequence.
    assert sorted(path.name for path in (tmp_path / "a" / "data" / "train.ffr").iterdir()) == \
        [f"PART_{i:05d}.ffr" for i in range(4)]
