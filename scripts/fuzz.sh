#!/usr/bin/env bash
# Fuzzes tfhost's parsers with libFuzzer under ASan+UBSan (tests/fuzz):
# the safetensors reader, the JSON reader, the script options parser and the
# REPL's chunk handling. Builds build-fuzz/ with clang, then runs each
# harness from its seed corpus (tests/fuzz/corpus/<name>; new inputs go to a
# scratch folder, never into the checkout).
#
#   scripts/fuzz.sh                      each harness for 12 s, as many at once as there are cores (CI)
#   scripts/fuzz.sh --seconds 600 json   one harness for 10 minutes
#   scripts/fuzz.sh --runs 10000000      each harness for 10 million inputs
#   scripts/fuzz.sh --max-len 256 repl   inputs of at most 256 bytes (default: libFuzzer's 4096)
#
# A finding (crash, sanitizer report, leak, timeout) makes it exit 1 once
# every harness has run, printing that harness's log, and leaves the input
# in build-fuzz/findings/<name>/; add it to the
# harness's corpus, where tests/fuzz/replay.c runs it in every ctest build.
# Without clang's libFuzzer (scripts/install-deps.sh installs it) this says
# why and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time=12)
max_len=()
harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --max-len) max_len=(-max_len="$2"); shift 2 ;;
    json|options|repl|safetensors) harnesses+=("$1"); shift ;;
    *) echo "fuzz: unknown argument '$1' (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
[ ${#harnesses[@]} -eq 0 ] && harnesses=(safetensors json options repl)

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe/p.c"
if ! command -v clang >/dev/null || ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  echo "fuzz: SKIPPED: clang with libFuzzer is not installed (Debian packages clang and libclang-rt-dev)"
  exit 0
fi

jobs=$(nproc)
CC=clang cmake -S . -B build-fuzz -DTF_FUZZ=ON -DTF_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$jobs" --target "${harnesses[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One harness: its log and outcome in $probe/<name>.log and $probe/<name>.status.
fuzz_one() {
  local name=$1 work="$probe/corpus-$1" findings=build-fuzz/findings/$1 start rc=0
  mkdir -p "$work" "$findings"
  start=$(date +%s)
  build-fuzz/fuzz_"$name" "${limit[@]}" "${max_len[@]}" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" tests/fuzz/corpus/"$name" >"$probe/$name.log" 2>&1 || rc=$?
  echo "$rc $(( $(date +%s) - start ))" >"$probe/$name.status"
}
# As many harnesses at once as there are cores (each is one process), then
# their outcomes in order.
for name in "${harnesses[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "== fuzz_$name ${limit[*]}"
  fuzz_one "$name" &
done
wait
failed=0
for name in "${harnesses[@]}"; do
  read -r rc seconds <"$probe/$name.status"
  if [ "$rc" != 0 ]; then
    tail -40 "$probe/$name.log"
    echo "fuzz: fuzz_$name found a problem; the input is in build-fuzz/findings/$name/" >&2
    failed=1
    continue
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$probe/$name.log")
  echo "fuzz_$name: $runs inputs in $seconds s, no finding"
done
exit $failed
