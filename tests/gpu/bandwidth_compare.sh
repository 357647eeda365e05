#!/usr/bin/env bash
# Two builds of tfhost side by side on one GPU, in one call: the memory-bound
# kernels of a training step (experiments/kernel_bandwidth.lua), the builds
# taking turns (old, new, old, new, ...) so that both see the same GPU
# states. A training step's clock moves with the board's power and
# temperature (runs whose GEMMs take 15 % less time than usual happen), so
# every run's step and GEMM time is printed beside its kernels: compare runs
# whose GEMM times agree. Logs and JSON go to $OUT (or ./gpu-out); the table
# is printed last.
#   tests/gpu/bandwidth_compare.sh OLD_BUNDLE NEW_BUNDLE [rounds] [kernel_bandwidth.lua options]
#   tests/gpu/bandwidth_compare.sh old/bundle build/bundle 2 --size xl --context 512
set -uo pipefail
usage="usage: tests/gpu/bandwidth_compare.sh OLD_BUNDLE NEW_BUNDLE [rounds] [kernel_bandwidth.lua options]"
old=$(realpath "${1:?$usage}")/tfhost
new=$(realpath "${2:?$usage}")/tfhost
rounds=${3:-2}
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "bandwidth_compare: rounds must be a positive whole number, not '$rounds' ($usage)" >&2
  exit 2
fi
shift $(( $# < 3 ? $# : 3 ))
out=${OUT:-gpu-out}/bandwidth
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/../.."
for bin in "$old" "$new"; do
  [ -x "$bin" ] || { echo "bandwidth_compare: no tfhost at $bin" >&2; exit 2; }
done
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "bandwidth_compare: SKIPPED: no GPU (nvidia-smi -L fails)"
  exit 77
fi

failed=0
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    echo "round $round/$rounds: $which" >&2
    if ! "$bin" experiments/kernel_bandwidth.lua "$@" --json "$out/${which}_$round.json" \
        > "$out/${which}_$round.md" 2> "$out/${which}_$round.err"; then
      echo "kernel_bandwidth.lua ($which, round $round) failed: see $out/${which}_$round.err" >&2
      failed=1
    fi
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = []  # (label, document)
for r in range(1, rounds + 1):
    for which in ("old", "new"):
        path = os.path.join(out, f"{which}_{r}.json")
        if os.path.exists(path):
            runs.append((f"{which} {r}", json.load(open(path))))
if not runs:
    sys.exit("bandwidth_compare: no run wrote its results")
print("| run | copy rate GB/s | step ms (m:step) | GEMMs and attention ms | memory-bound kernels ms |")
print("|---|---|---|---|---|")
for label, d in runs:
    print(f"| {label} | {d['copy_gbps']:.0f} | {d['step_ms']:.2f} | {d['compute_bound_ms']:.2f} | "
          f"{d['memory_bound_ms']:.2f} |")
print()
names = []
for _, d in runs:
    for row in d["results"]:
        if row.get("bytes") and row["kernel"] not in names:
            names.append(row["kernel"])
print("| kernel | GB/step | " + " | ".join(label for label, _ in runs) + " |")
print("|---|---|" + "---|" * len(runs))
for name in names:
    cells, gb = [], None
    for _, d in runs:
        row = next((x for x in d["results"] if x["kernel"] == name), None)
        if row is None:
            cells.append("-")
            continue
        gb = row["bytes"] / 1e9
        cells.append(f"{row['ms']:.3f} ({row['fraction']:.2f})")
    print(f"| {name} | {gb:.3f} | " + " | ".join(cells) + " |")
print("\nms a step (fraction of the copy rate measured in the same run)")
PY
exit $failed
