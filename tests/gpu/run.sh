#!/usr/bin/env bash
# Runs the whole test suite on a GPU machine that has no build tools, from a
# bundle folder (cmake --build build --target bundle; the C GPU tests such as
# test_nnops_cuda may be copied beside tfhost), refreshes the PyTorch oracle
# of the mixed-precision experiment when torch is there, and runs the
# experiments. Logs go to $OUT (or ./gpu-out); a summary is printed last.
# The whole run takes longer than some machines lend for one command:
# TF_GPU_PARTS picks parts (a comma list of oracles, c, lua, cli, sanitize,
# experiments; default all of them), so that it can run as several calls;
# TF_SANITIZE_TESTS and TF_SANITIZE_TOOLS narrow the sanitize part (sanitize.sh).
#   tests/gpu/run.sh build/bundle
#   TF_GPU_PARTS=c,lua tests/gpu/run.sh build/bundle; TF_GPU_PARTS=cli,sanitize,experiments tests/gpu/run.sh ...
set -uo pipefail
dir=$(realpath "${1:?usage: tests/gpu/run.sh path/to/bundle}")
bin=$dir/tfhost
out=${OUT:-gpu-out}/logs
mkdir -p "$out"
cd "$(dirname "$0")/../.."
summary=()
failed=0
parts=${TF_GPU_PARTS:-oracles,c,lua,cli,sanitize,experiments}
for part in ${parts//,/ }; do
  case $part in
    oracles | c | lua | cli | sanitize | experiments) ;;
    *) echo "run.sh: unknown part '$part' in TF_GPU_PARTS (oracles, c, lua, cli, sanitize, experiments)" >&2; exit 2 ;;
  esac
done
want() { [[ ",$parts," == *",$1,"* ]]; }
record() { # name, status, detail
  summary+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")")
  echo "${summary[-1]}" >> "$out/progress.txt" # read this when a run is cut off
  if [ "$2" = "FAIL" ]; then failed=1; fi
  return 0
}
lua_test() { # name, command...: a Lua test file's run, its log and its line in the summary
  local name=$1 rc
  shift
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then record "$name" ok "$(grep -v '^\[rank' "$out/$name.log" | tail -1)"
  elif [ $rc -eq 77 ]; then record "$name" skip "$(grep SKIP "$out/$name.log")"
  else record "$name" FAIL "rc=$rc"; grep -A6 FAIL "$out/$name.log" | head -40; fi
}

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$bin" -v

if want oracles && python3 -c "import torch" 2>/dev/null; then
  mkdir -p tests/reference/oracles
  if python3 tests/reference/torch_mixed_precision.py "$out/mixed_precision_torch.json" > "$out/torch_oracle.log" 2>&1; then
    cp "$out/mixed_precision_torch.json" tests/reference/oracles/mixed_precision.json
    record "torch oracle" ok "tests/reference/oracles/mixed_precision.json"
  else
    record "torch oracle" FAIL "$(tail -1 "$out/torch_oracle.log")"
  fi
  if python3 tests/reference/torch_lm.py "$out/lm_tiny.safetensors" > "$out/torch_lm.log" 2>&1; then
    cp "$out/lm_tiny.safetensors" tests/reference/oracles/lm_tiny.safetensors
    record "torch LM oracle" ok "$(tail -1 "$out/torch_lm.log")"
  else
    record "torch LM oracle" FAIL "$(tail -3 "$out/torch_lm.log" | tr '\n' ' ')"
  fi
fi

want c && for t in "$dir"/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" > "$out/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && record "$name" ok "$(tail -1 "$out/$name.log")" || record "$name" FAIL "rc=$rc, see $name.log"
done

want lua && for t in tests/lua/test_*.lua; do
  lua_test "$(basename "$t" .lua)" "$bin" "$t"
done

# tf.dist and data-parallel training as 2 GPU ranks (NCCL), where there are two GPUs
want lua && for t in dist ddp; do
  lua_test "test_${t}_2_gpus" env TF_DDP_DEVICE=default TF_DIST_TIMEOUT=60 tests/lua/on_gpus.sh "$bin" 2 \
    "tests/lua/test_$t.lua"
done

# the GPU machines have no chromium: the memory-plot rendering test runs in CI
export TF_ALLOW_NO_CHROMIUM=1
want cli && for t in tests/cli/test_*.py; do
  name=$(basename "$t" .py)
  python3 "$t" "$bin" > "$out/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then record "$name" ok "$(grep -E '^Ran' "$out/$name.log")"
  elif [ $rc -eq 77 ]; then record "$name" skip "$(grep SKIP "$out/$name.log")"
  else record "$name" FAIL "rc=$rc"; tail -30 "$out/$name.log"; fi
done

# memcheck, racecheck and synccheck over the flash, fused-model and ops kernels
if want sanitize; then
  OUT="$out" tests/gpu/sanitize.sh "$dir" > "$out/sanitize.log" 2>&1
  rc=$?
  while read -r tool test status detail; do
    record "$tool $test" "$status" "$detail"
  done < <(cat "$out/sanitize/summary.txt" 2>/dev/null)
  [ $rc -eq 77 ] && record "compute-sanitizer" skip "$(grep SKIPPED "$out/sanitize.log")"
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && record "compute-sanitizer" FAIL "rc=$rc, see sanitize.log"
fi

if want experiments; then
  echo "== experiments"
  "$bin" experiments/mixed_precision.lua --json "$out/mixed_precision.json" > "$out/mixed_precision.log" 2>&1 \
    && record "mixed_precision.lua" ok "$(grep -A4 '## 4' "$out/mixed_precision.log" | tail -1)" \
    || record "mixed_precision.lua" FAIL "see mixed_precision.log"
fi

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
# one archive of every log (the results JSON files stay beside it)
tar -C "$out" -czf "$out/../logs.tgz" . && cp "$out"/*.json "$out"/*.safetensors "$out/.." 2>/dev/null
exit $failed
