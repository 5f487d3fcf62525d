"""The table of a bench/ab.sh run: for every figure bench/core.py, bench/dataloader.py
and bench/compare.py report, the median over rounds for the old and the new commit,
new/old, and each side's spread (max/min over its rounds).  A ratio inside the spread
is noise; outside both spreads, a change.

    python bench/ab_table.py /tmp/packfs-ab/results
"""

from __future__ import annotations

import glob
import json
import statistics
import sys


def flat_core(d):
    m = {}
    p = d["pack"]
    m["pack: packfs files/s"] = p["packfs_files_per_s"]
    m["pack: packfs MB/s"] = p["packfs_MB_per_s"]
    m["pack: tar time / packfs time"] = p["tar_over_packfs_time_ratio"]
    for n, s in d["scale"].items():
        for cd in ("True", "False"):
            r = s[f"check_data={cd}"]
            m[f"scale {n}: open ms (check_data={cd})"] = r["open_s"] * 1e3
            m[f"scale {n}: lookups/s (check_data={cd})"] = r["lookups_per_s"]
            m[f"scale {n}: RSS growth at open MiB (check_data={cd})"] = (
                r["rss_after_open"] - r["rss_before"]
            ) / 2**20
            m[f"scale {n}: peak RSS growth during open MiB (check_data={cd})"] = (
                r["peak_rss_open"] - r["rss_before"]
            ) / 2**20
            m[f"scale {n}: RSS after lookups growth MiB (check_data={cd})"] = (
                r["rss_after_lookups"] - r["rss_before"]
            ) / 2**20
        mo = s["mount"]
        m[f"scale {n}: mount s"] = mo["mount_s"]
        m[f"scale {n}: daemon RSS mounted MiB"] = mo["daemon_rss_mounted_MiB"]
        m[f"scale {n}: find|wc s"] = mo["find_wc_s"]
        m[f"scale {n}: daemon peak RSS after find MiB"] = mo["daemon_peak_rss_MiB"]
    for k in ("api_4KiB", "api_100KB"):
        for kk, v in d[k].items():
            m[f"{k}: {kk}"] = v
    return m


def flat_dl(d):
    m = {}
    for r in d["results"]:
        m[f"DL {r['mode']} w={r['workers']} {r['loader']}: samples/s"] = r["samples_per_s"]
        if r["loader"] != "plain":
            m[f"DL {r['mode']} w={r['workers']} {r['loader']}: ratio to plain"] = r["ratio_to_plain"]
    for r in d["reads"]:
        m[f"in-proc {r['files']} {r['order']} {r['way']}: files/s"] = r["files_per_s"]
        if r["speed_vs_one_at_a_time"] != 1.0:
            m[f"in-proc {r['files']} {r['order']} {r['way']}: vs files[i]"] = r["speed_vs_one_at_a_time"]
    return m


def flat_cmp(d):
    m = {}
    for sys_, v in d["systems"].items():
        base = d["baselines"].get(sys_, d["systems"]["plain"])
        for k, t in v.items():
            if k.endswith("_s") and k != "mount_s":
                if sys_ == "plain":
                    m[f"cmp plain: {k}"] = t
                else:
                    m[f"cmp {sys_}: {k} ratio to plain"] = (
                        base[k] / t if sys_ != "plain (again, drift check)" else d["systems"]["plain"][k] / t
                    )
            else:
                m[f"cmp {sys_}: {k}"] = t
    for k, v in d["pack_seconds"].items():
        m[f"cmp pack s: {k}"] = v
    for k in ("api_4KiB", "api_100KB"):
        for kk, v in d[k].items():
            m[f"cmp {k}: {kk}"] = v
    return m


F = {"core": flat_core, "dataloader": flat_dl, "compare": flat_cmp}


def table(results: str) -> None:
    for script, flatten in F.items():
        runs: dict[str, dict[str, dict[str, float]]] = {"old": {}, "new": {}}
        for side in runs:
            for path in sorted(glob.glob(f"{results}/{script}-{side}-*/{script}.json")):
                runs[side][path.split("/")[-2].rsplit("-", 1)[1]] = flatten(json.load(open(path)))
        if not runs["old"] or not runs["new"]:
            continue
        print(f"\n### {script} (rounds: old {sorted(runs['old'])}, new {sorted(runs['new'])})\n")
        print("| figure | old median | new median | new/old | old max/min | new max/min |")
        print("|---|---|---|---|---|---|")
        for key in next(iter(runs["old"].values())):
            old = [run[key] for run in runs["old"].values() if key in run]
            new = [run[key] for run in runs["new"].values() if key in run]
            if not old or not new or not statistics.median(old):
                continue
            spread = lambda xs: f"{max(xs) / min(xs):.2f}" if min(xs) > 0 else "n/a"
            show = lambda x: f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
            print(
                f"| {key} | {show(statistics.median(old))} | {show(statistics.median(new))} | "
                f"{statistics.median(new) / statistics.median(old):.2f} | {spread(old)} | {spread(new)} |"
            )


if __name__ == "__main__":
    table(sys.argv[1] if len(sys.argv) > 1 else "/tmp/packfs-ab/results")
