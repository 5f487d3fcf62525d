"""Runs of the compiled daemon's fuzzer and stress program, with their counts (the
Makefile's fuzz-c, fuzz-c-tsan and fuzz-c-coverage targets call this).

    python fuzz/campaign.py fuzz --binary B --seconds S --corpus DIR --seeds DIR --findings DIR --regressions DIR
    python fuzz/campaign.py tsan --binary B --seconds S --log FILE ARCHIVE-OR-DIR...
    python fuzz/campaign.py coverage --binary B --source packfs/cformat/*.c ... --work DIR INPUT-DIR...

fuzz: first every input of the regressions directory (each a past finding) is run once,
then libFuzzer fuzzes for S seconds from the corpus (kept between runs) and the seeds;
it stops at the first finding, which it saves in the findings directory.  Prints the
runs, libFuzzer's coverage (cov: edges, ft: features), the corpus and the findings;
exits 1 if there is a finding (a regression that fails again is one).

tsan: runs the ThreadSanitizer program for S seconds and counts the races it reports
(exit 1 if any).

coverage: runs a coverage-instrumented build over the inputs once each and prints
llvm-cov's line, region and branch coverage of the source file, and the functions no
input reached.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

FINDING_PREFIXES = ("crash-", "leak-", "timeout-", "oom-")
# Inputs up to 3 MiB: the seeds with a file over 1 MiB (piece CRCs) are 2.1 MB.
MAX_LEN = 3 << 20
# libFuzzer's: a case may take 10 s (the slowest takes milliseconds) and 4 GiB.
LIBFUZZER_LIMITS = ["-timeout=10", "-rss_limit_mb=4096", f"-max_len={MAX_LEN}"]
SANITIZERS = {
    "ASAN_OPTIONS": "detect_leaks=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    environment = dict(os.environ)
    for name, value in extra.items():
        environment.setdefault(name, value)
    return environment


def _findings(directory: Path) -> set[Path]:
    return {p for p in directory.iterdir() if p.name.startswith(FINDING_PREFIXES)} if directory.exists() else set()


def replay(binary: Path, regressions: Path) -> int:
    """Run each past finding once; the number that fail again."""
    inputs = sorted(p for p in regressions.glob("*") if p.is_file() and not p.name.endswith(".md"))
    failed = 0
    for path in inputs:
        result = subprocess.run([str(binary), *LIBFUZZER_LIMITS, str(path)], capture_output=True, text=True,
                                env=_environment(SANITIZERS))
        if result.returncode != 0:
            failed += 1
            print(result.stderr[-4000:], file=sys.stderr)
            print(f"regression {path} fails again", file=sys.stderr)
    print(f"fuzz-c: {len(inputs)} regression inputs replayed, {failed} failing")
    return failed


def fuzz(args: argparse.Namespace) -> int:
    for directory in (args.corpus, args.findings):
        directory.mkdir(parents=True, exist_ok=True)
    failed = replay(args.binary, args.regressions)
    before = _findings(args.findings)
    started = time.monotonic()
    command = [str(args.binary), f"-max_total_time={args.seconds}", *LIBFUZZER_LIMITS, "-print_final_stats=1",
               f"-artifact_prefix={args.findings}/", str(args.corpus), str(args.seeds)]
    print("fuzz-c: " + " ".join(command), flush=True)
    log = args.findings / "last-run.log"
    with open(log, "w") as out:
        process = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=_environment(SANITIZERS))
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    status = [line for line in text.splitlines() if re.match(r"#\d+\s", line) and " cov: " in line]
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", text, re.M))
    runs = int(stats.get("number_of_executed_units", 0))
    last = status[-1] if status else ""
    cov = re.search(r"cov: (\d+)", last)
    ft = re.search(r"ft: (\d+)", last)
    corpus = sum(1 for p in args.corpus.iterdir() if p.is_file())
    new = sorted(_findings(args.findings) - before)
    print(f"fuzz-c: {runs:,} runs in {seconds:.0f} s ({runs / max(seconds, 1e-9):,.0f}/s); libFuzzer coverage "
          f"cov {cov.group(1) if cov else '?'} (edges), ft {ft.group(1) if ft else '?'} (features); "
          f"corpus {corpus:,} inputs in {args.corpus}; findings: {len(new)}")
    for path in new:
        print(f"fuzz-c: finding {path} (reproduce: {args.binary} {path}; minimise: {args.binary} "
              f"-minimize_crash=1 -runs=100000 {path})")
        print("\n".join(text.splitlines()[-60:]), file=sys.stderr)
    if process.returncode != 0 and not new:
        print(text[-4000:], file=sys.stderr)
        print(f"fuzz-c: the fuzzer exited with status {process.returncode}", file=sys.stderr)
        return 1
    return 1 if new or failed else 0


def tsan(args: argparse.Namespace) -> int:
    command = [str(args.binary), "--seconds", str(args.seconds), "--threads", str(args.threads),
               *map(str, args.inputs)]
    print("fuzz-c-tsan: " + " ".join(command), flush=True)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "w") as out:
        process = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                 env=_environment({"TSAN_OPTIONS": "halt_on_error=0:second_deadlock_stack=1"}))
    text = args.log.read_text(errors="replace")
    races = len(re.findall(r"WARNING: ThreadSanitizer: data race", text))
    warnings = len(re.findall(r"WARNING: ThreadSanitizer:", text))
    summary = [line for line in text.splitlines() if line.startswith("lowlevel-tsan:")]
    print(summary[-1] if summary else text[-2000:])
    print(f"fuzz-c-tsan: {races} data races, {warnings} ThreadSanitizer warnings in all (log: {args.log})")
    if warnings:
        print("\n".join(line for line in text.splitlines() if "ThreadSanitizer" in line or line.startswith("    #"))
              [:6000], file=sys.stderr)
    return 1 if warnings or process.returncode != 0 else 0


def coverage(args: argparse.Namespace) -> int:
    args.work.mkdir(parents=True, exist_ok=True)
    raw = args.work / "fuzz-%p.profraw"
    for stale in args.work.glob("*.profraw"):
        stale.unlink()
    inputs = [str(p) for p in args.inputs if p.exists()]
    subprocess.run([str(args.binary), "-runs=0", f"-max_len={MAX_LEN}", *inputs], capture_output=True,
                   env=_environment({"LLVM_PROFILE_FILE": str(raw)}), check=True)
    merged = args.work / "fuzz.profdata"
    subprocess.run([args.llvm_profdata, "merge", "-sparse", *map(str, args.work.glob("*.profraw")), "-o",
                    str(merged)], check=True)
    report = subprocess.run([args.llvm_cov, "report", str(args.binary), f"-instr-profile={merged}",
                             *map(str, args.source)], check=True, capture_output=True, text=True).stdout
    functions = subprocess.run([args.llvm_cov, "report", "-show-functions", str(args.binary),
                                f"-instr-profile={merged}", *map(str, args.source)],
                               check=True, capture_output=True, text=True).stdout
    total = next(line for line in report.splitlines() if line.startswith("TOTAL")).split()
    # TOTAL regions missed cover functions missed executed lines missed cover branches missed cover
    print(f"fuzz-c-coverage of {' '.join(map(str, args.source))} over {len(inputs)} inputs: lines {total[9]} "
          f"({int(total[7]) - int(total[8]):,} of {int(total[7]):,}), regions {total[3]}, branches {total[12]}, "
          f"functions {total[6]}")
    unreached = [line.split()[0].split(":")[-1] for line in functions.splitlines()
                 if re.match(r"^\S+\s+\d+\s+\d+\s+0\.00%", line)]
    print(f"fuzz-c-coverage: functions no input reached: {', '.join(unreached) or 'none'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("fuzz")
    run.add_argument("--binary", type=Path, required=True)
    run.add_argument("--seconds", type=int, default=60)
    run.add_argument("--corpus", type=Path, required=True)
    run.add_argument("--seeds", type=Path, required=True)
    run.add_argument("--findings", type=Path, required=True)
    run.add_argument("--regressions", type=Path, required=True)
    stress = commands.add_parser("tsan")
    stress.add_argument("--binary", type=Path, required=True)
    stress.add_argument("--seconds", type=int, default=60)
    stress.add_argument("--threads", type=int, default=4)
    stress.add_argument("--log", type=Path, required=True)
    stress.add_argument("inputs", type=Path, nargs="+")
    measured = commands.add_parser("coverage")
    measured.add_argument("--binary", type=Path, required=True)
    measured.add_argument("--source", type=Path, nargs="+", required=True)
    measured.add_argument("--work", type=Path, required=True)
    measured.add_argument("--llvm-profdata", default="llvm-profdata-14")
    measured.add_argument("--llvm-cov", default="llvm-cov-14")
    measured.add_argument("inputs", type=Path, nargs="+")
    args = parser.parse_args()
    return {"fuzz": fuzz, "tsan": tsan, "coverage": coverage}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
