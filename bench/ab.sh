#!/bin/bash
# Two commits side by side: bench/core.py, bench/dataloader.py and bench/compare.py run
# for each, alternating (OLD, NEW, OLD, NEW, ...) so that a machine's drift hits both
# alike, every run pinned to one CPU.  Then bench/ab_table.py prints the medians, the
# NEW/OLD ratio and each side's spread (max/min over rounds: the noise to judge a
# ratio against).
#
#   bash bench/ab.sh OLD NEW [ROUNDS] [CPU]      e.g.  bash bench/ab.sh HEAD~5 HEAD 3 1
#   AB_SCRIPTS="core dataloader" bash bench/ab.sh ...   (a subset of the three)
#
# Each commit is checked out in a worktree under $AB_DIR (default /tmp/packfs-ab) with
# its C extension built there; the interpreter is this checkout's .venv (make setup).
# compare.py needs `make bench-tools` (squashfs, squashfuse, ratarmount) first.
set -euo pipefail
old=${1:?usage: bench/ab.sh OLD NEW [ROUNDS] [CPU]}
new=${2:?usage: bench/ab.sh OLD NEW [ROUNDS] [CPU]}
rounds=${3:-3}
cpu=${4:-1}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$repo/.venv/bin/python
dir=${AB_DIR:-/tmp/packfs-ab}
export RATARMOUNT=${RATARMOUNT:-$repo/bench/.ratarmount-venv/bin/ratarmount}
mkdir -p "$dir/results"
for side in old new; do
    rev=$([ $side = old ] && echo "$old" || echo "$new")
    git -C "$repo" worktree remove --force "$dir/$side" 2>/dev/null || rm -rf "${dir:?}/$side"
    git -C "$repo" worktree add -q --detach "$dir/$side" "$rev"
    (cd "$dir/$side" && "$py" setup.py -q build_ext --inplace >/dev/null 2>&1) \
        || echo "note: packfs._sigbus not built for $side ($rev): it runs unguarded"
done
for round in $(seq 1 "$rounds"); do
    for script in ${AB_SCRIPTS:-core dataloader compare}; do
        args=$([ $script = core ] && echo "--files 20000 --entries 200000" || true)
        for side in old new; do
            out=$dir/results/$script-$side-$round
            mkdir -p "$dir/work"
            echo "$(date +%T) round $round: $script, $side"
            # shellcheck disable=SC2086
            taskset -c "$cpu" "$py" "$dir/$side/bench/$script.py" $args --out "$out" --work "$dir/work" \
                > "$out.log" 2>&1 || echo "  failed: see $out.log"
            rm -rf "$dir/work"
        done
    done
done
"$py" "$repo/bench/ab_table.py" "$dir/results"
