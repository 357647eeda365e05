"""tfhost's hardware counters (tf.prof.count{metrics = "roofline"}) against Nsight Compute's, kernel by kernel.

tests/gpu/ncu_kernels.lua launches a bf16 GEMM, FlashAttention forward and backward, RMSNorm, SwiGLU, an
AdamW step and a cross-entropy, one pass counted. It runs twice: under ncu (only the range "ncu kernels",
DRAM bytes and the FLOP instruction metrics below), and alone with --counters, where tfhost counts the same
pass and writes each kernel's counters. Both count the same way: the work run once per counting pass
(ncu's application replay, tf.prof.count), caches left as the work leaves them (ncu --cache-control
none), so that each kernel starts from the L2 state its predecessors left on both sides; ncu's default
(flushing the caches before each kernel) would move the write-backs of one kernel's dirty lines into the
next one's count on one side only. The
kernels are matched by name in launch order; for each, the DRAM bytes read and written and the FLOPs
(tensor-pipe operations plus the FP32, FP16 and FP64 instructions, a fused multiply-add two) are compared.

DRAM writes are judged by op, not by kernel: a kernel's dirty lines still in the L2 when it ends are
written back by whatever runs next, and how many that is varies from run to run (the GEMM's writes by
4.6 % between two runs on one side), so an op's writes are its kernels' and those of the clearing read
after it (ncu_kernels.lua reads a buffer four times the L2 after each op), which come to what the op
wrote: 33.6 MB for the GEMM's 33.55 MB output on an H200.

Replaying each kernel (--replay kernel, tf.prof.start{metrics}), DRAM writes are shown, not judged:
before each replay both tools restore the memory the kernel writes, and the write-backs of the lines
that restore leaves dirty in the L2 land in the replayed kernel's count, a different amount on each
side (on an H200 the row sums of FlashAttention's backward, 2 MB written, counted 7.6 MB under ncu
and 25 MB under tfhost); reads and FLOPs are judged as by passes.

It fails (exit 1) where DRAM bytes or FLOPs differ by more than 3 % (kernels that move at least 1 MiB or
do at least 1 MFLOP; smaller ones are shown, not judged), where the GEMM's FLOPs in tfhost's counters
differ from 2 M N K by more than 1 %, or where nothing could be matched. Exit 77: no GPU or no ncu here.

    python3 tests/reference/ncu_compare.py path/to/tfhost [--json compare.json] [--ncu ncu]
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "gpu", "ncu_kernels.lua")
SKIP = 77
TOLERANCE = 0.03       # DRAM bytes and FLOPs, tfhost against ncu
GEMM_TOLERANCE = 0.01  # the GEMM's FLOPs against 2 M N K
MIN_BYTES = 1 << 20    # smaller kernels are shown, not judged
MIN_FLOPS = 1e6

DRAM = {"dram_read": "dram__bytes_read.sum", "dram_write": "dram__bytes_write.sum"}
# FLOPs as ncu's roofline counts them: the tensor pipe's operations, and per thread an add or a
# multiply one FLOP, a fused multiply-add two
TENSOR = ["sm__ops_path_tensor_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
          "sm__ops_path_tensor_src_fp16_dst_fp32.sum", "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
          "sm__ops_path_tensor_src_fp8.sum", "sm__ops_path_tensor_src_fp8_dst_fp16.sum",
          "sm__ops_path_tensor_src_fp8_dst_fp32.sum", "sm__ops_path_tensor_src_fp64.sum"]
SCALAR = {}
for prefix in ("f", "h", "d"):
    for op, weight in (("add", 1), ("mul", 1), ("fma", 2)):
        SCALAR[f"smsp__sass_thread_inst_executed_op_{prefix}{op}_pred_on.sum"] = weight


def available_metrics(ncu):
    """The metric names this ncu and GPU know (ncu --query-metrics), without their .sum etc."""
    r = subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=300)
    names = set()
    for line in r.stdout.splitlines():
        first = line.split(",", 1)[0].strip().strip('"')
        if re.match(r"^[a-z0-9_]+__[a-z0-9_]+$", first):
            names.add(first)
    return names


def wanted_metrics(known):
    """The metrics passed to ncu: those of the lists above that this GPU has (all of them if the query
    gave nothing), and the ones it lacks (shown, and counted as 0 on both sides)."""
    every = list(DRAM.values()) + TENSOR + list(SCALAR)
    if not known:
        return every, []
    have = [m for m in every if m.rsplit(".", 1)[0] in known]
    return have, [m for m in every if m not in have]


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def ncu_kernels(ncu, tfhost, metrics, tmp, replay="application", cache="none", gemm=None):
    """Runs ncu_kernels.lua under ncu; a list of {name, metric: value} in launch order, and ncu's raw CSV."""
    report = os.path.join(tmp, "ncu")
    cmd = [ncu, "--nvtx", "--nvtx-include", "ncu kernels/", "--metrics", ",".join(metrics), "--cache-control", cache,
           "--replay-mode", replay,
           "--force-overwrite", "-o", report, tfhost, SCRIPT] + (["--gemm", str(gemm)] if gemm else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"ncu_compare.py: ncu failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    r = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"ncu_compare.py: ncu --import failed:\n{r.stderr[-3000:]}")
    return parse_ncu_csv(r.stdout, metrics), r.stdout


def parse_ncu_csv(text, metrics):
    """ncu --page raw --csv output: a list of {name, metric: value} in launch order."""
    rows = list(csv.DictReader(io.StringIO(text[text.find('"ID"'):])))
    out = []
    for row in rows:
        if number(row.get("ID")) is None:  # the units' row
            continue
        k = {"name": row.get("Kernel Name", "")}
        for m in metrics:
            k[m] = number(row.get(m)) or 0.0
        out.append(k)
    return out


def tfhost_kernels(tfhost, tmp, replay, gemm=None):
    """Runs ncu_kernels.lua with tfhost's own counters (by passes, or replaying each kernel); its JSON document."""
    path = os.path.join(tmp, "counted.json")
    r = subprocess.run([tfhost, SCRIPT, "--counters", path, "--replay", replay] + (["--gemm", str(gemm)] if gemm else []),
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"ncu_compare.py: tfhost's counted run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def quantities(values):
    """DRAM bytes read and written and FLOPs from metric values (a dict by metric name)."""
    def get(m):
        v = values.get(m)
        if v is None:
            v = values.get(m.rsplit(".", 1)[0])  # a counter named without its roll-up
        if v is None and m.startswith("smsp__"):
            v = values.get("sm__" + m[len("smsp__"):])  # tfhost counts the SM's sum, the same total
        return float(v or 0)
    q = {key: get(m) for key, m in DRAM.items()}
    q["flops"] = sum(get(m) for m in TENSOR) + sum(w * get(m) for m, w in SCALAR.items())
    return q


def ours_quantities(kernel, rows_by_name):
    """A tfhost kernel's quantities from its raw counters where they carry ncu's metric names; else from
    its p:kernels{by = "name"} row (flops, dram_read, dram_write) where that name ran once."""
    counters = kernel.get("counters") or {}
    names = set(DRAM.values()) | set(TENSOR) | set(SCALAR)
    if any(k in names or k + ".sum" in names for k in counters):
        return quantities(counters)
    row = rows_by_name.get(kernel.get("short_name")) or rows_by_name.get(kernel.get("name")) or {}
    return {"dram_read": float(row.get("dram_read") or 0), "dram_write": float(row.get("dram_write") or 0),
            "flops": float(row.get("flops") or 0)}


def base_name(name):
    """A kernel's function name without return type, namespaces, template arguments and parameters."""
    name = re.sub(r"\(.*$", "", name or "")
    depth, plain = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            plain.append(ch)
    name = "".join(plain).strip().split(" ")[-1]
    return name.split("::")[-1]


def match(ncu, ours):
    """Pairs (ncu kernel, tfhost kernel) in launch order by base name; each side's leftovers."""
    pairs, j, unmatched = [], 0, []
    for k in ncu:
        want = base_name(k["name"])
        found = None
        for i in range(j, len(ours)):
            if base_name(ours[i].get("name")) == want or base_name(ours[i].get("short_name")) == want:
                found = i
                break
        if found is None:
            unmatched.append(k["name"])
            continue
        pairs.append((k, ours[found]))
        j = found + 1
    used = {id(o) for _, o in pairs}
    return pairs, unmatched, [o.get("name") for o in ours if id(o) not in used]


def rel(a, b):
    return abs(b - a) / a if a else (0.0 if b == 0 else float("inf"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tfhost")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    ap.add_argument("--json", help="also write the comparison here")
    ap.add_argument("--replay", default="pass", choices=["pass", "kernel"],
                    help="how tfhost counts: by passes (tf.prof.count, the default) or by replaying each kernel")
    ap.add_argument("--ncu-replay", default=None, choices=["application", "kernel"],
                    help="ncu's replay mode (default: application with --replay pass, kernel with --replay kernel)")
    ap.add_argument("--ncu-cache", default="none", choices=["none", "all"],
                    help="ncu's --cache-control (default none: the caches as the work leaves them)")
    ap.add_argument("--gemm", type=int, help="the GEMM's size (ncu_kernels.lua's --gemm)")
    ap.add_argument("--keep", help="a folder to keep ncu's CSV (ncu.csv) and tfhost's counts (counted.json) in")
    ap.add_argument("--from", dest="from_dir", help="compare what --keep kept there, running nothing")
    args = ap.parse_args()
    if args.from_dir:
        with open(os.path.join(args.from_dir, "ncu.csv")) as f:
            text = f.read()
        with open(os.path.join(args.from_dir, "counted.json")) as f:
            doc = json.load(f)
        metrics, missing = wanted_metrics(set())
        return compare(parse_ncu_csv(text, metrics), doc, metrics, [], args.json)
    tfhost = os.path.abspath(args.tfhost)
    if not shutil.which(args.ncu):
        print(f"ncu_compare.py: SKIP: no ncu ({args.ncu}) on this machine", file=sys.stderr)
        return SKIP
    gpu = subprocess.run([tfhost, "-e", "io.write(tostring(tf.cuda.is_available()))"], capture_output=True,
                         text=True, timeout=120).stdout.strip() == "true"
    if not gpu:
        print("ncu_compare.py: SKIP: tfhost sees no CUDA device", file=sys.stderr)
        return SKIP
    metrics, missing = wanted_metrics(available_metrics(args.ncu))
    if missing:
        print("metrics this GPU does not have (0 on both sides): " + ", ".join(missing))
    ncu_replay = args.ncu_replay or ("application" if args.replay == "pass" else "kernel")
    print(f"ncu: {ncu_replay} replay, cache control {args.ncu_cache}; tfhost: by {args.replay}")
    with tempfile.TemporaryDirectory() as tmp:
        theirs, text = ncu_kernels(args.ncu, tfhost, metrics, tmp, ncu_replay, args.ncu_cache, args.gemm)
        doc = tfhost_kernels(tfhost, tmp, args.replay, args.gemm)
    doc["ncu_replay"] = ncu_replay  # kept with tfhost's counts, for --from
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        with open(os.path.join(args.keep, "ncu.csv"), "w") as f:
            f.write(text)
        with open(os.path.join(args.keep, "counted.json"), "w") as f:
            json.dump(doc, f)
    return compare(theirs, doc, metrics, missing, args.json)


def compare(theirs, doc, metrics, missing, json_path):
    """Prints the kernels side by side; 1 where something fails, else 0."""
    ours = doc["kernels"]
    # replaying kernels (either side: tfhost's "replay", ncu's "ncu_replay"), the restore before each
    # replay leaves dirty lines whose write-backs the kernel's count takes in (the top of this file):
    # writes are shown, not judged
    writes_judged = doc.get("replay", "pass") == "pass" and doc.get("ncu_replay", "application") == "application"
    if not writes_judged:
        print("replaying kernels: DRAM writes include the write-backs of the memory restored before each replay; "
              "shown, not judged")
    rows_by_name = {r.get("name"): r for r in doc.get("rows", []) if r.get("instances") == 1}
    pairs, only_ncu, only_ours = match(theirs, ours)
    failures, table = [], []
    print(f"{len(theirs)} kernels under ncu, {len(ours)} counted by tfhost, {len(pairs)} matched")
    print(f"{'op':<16} {'kernel':<40} {'quantity':<10} {'ncu':>16} {'tfhost':>16} {'rel. diff':>10}")
    for n, o in pairs:
        qn = quantities(n)
        if not o.get("counters"):
            failures.append(f"{o.get('name')}: tfhost has no counters for it")
            continue
        qo = ours_quantities(o, rows_by_name)
        # counted by passes, tfhost has no CUDA-core instruction counts (they read 0 there): said as such
        uncounted = not any(m in o["counters"] or "sm__" + m[len("smsp__"):] in o["counters"] for m in SCALAR)
        for key in ("dram_read", "dram_write", "flops"):
            a, b = qn[key], qo[key]
            small = a < (MIN_FLOPS if key == "flops" else MIN_BYTES)
            d = rel(a, b)
            if o.get("op") == "clear":
                verdict = "not judged"
            elif small:
                verdict = "small"
            elif key == "dram_write":  # judged by op, below
                verdict = "by op" if writes_judged else "not judged (kernel replay)"
            else:
                verdict = "FAIL" if d > TOLERANCE else "ok"
            if key == "flops" and uncounted and verdict == "FAIL":
                verdict = "FAIL (tfhost counted the tensor pipe only)"
            print(f"{(o.get('op') or '-')[:16]:<16} {base_name(o.get('name'))[:40]:<40} {key:<10} {a:>16.6g} "
                  f"{b:>16.6g} {d:>9.2%} {verdict}")
            table.append({"op": o.get("op"), "kernel": o.get("name"), "quantity": key, "ncu": a, "tfhost": b,
                          "rel_diff": d, "verdict": verdict})
            if verdict.startswith("FAIL"):
                failures.append(f"{o.get('name')} ({o.get('op')}): {key} {b:.6g} against ncu's {a:.6g} ({d:.2%})")
    # DRAM writes by op: the op's kernels' and those of the clearing read after it, which writes back
    # what the op left dirty in the L2 (how much of that is written back before the op's last kernel
    # ends varies from run to run: 4.6 % of a 4096^3 GEMM's writes, whose 32 MiB output fits in the L2)
    ops = []
    for row in table:
        if row["quantity"] != "dram_write":
            continue
        if row["op"] == "clear":
            if ops:
                ops[-1]["clear"] = True
                ops[-1]["ncu"] += row["ncu"]
                ops[-1]["tfhost"] += row["tfhost"]
            continue
        if not ops or ops[-1]["op"] != row["op"] or ops[-1]["clear"]:
            ops.append({"op": row["op"], "ncu": 0.0, "tfhost": 0.0, "clear": False})
        ops[-1]["ncu"] += row["ncu"]
        ops[-1]["tfhost"] += row["tfhost"]
    print("DRAM writes by op, with the write-backs of its dirty lines in the clearing read after it:")
    for o in ops:
        a, b = o["ncu"], o["tfhost"]
        d = rel(a, b)
        verdict = "small" if a < MIN_BYTES else "FAIL" if d > TOLERANCE else "ok"
        if not writes_judged:
            verdict = "not judged (kernel replay)"
        elif not o["clear"] and verdict != "small":
            verdict = "FAIL (no clearing read after it)"
        print(f"{(o['op'] or '-')[:16]:<16} {'(the op, and the clear after it)':<40} {'dram_write':<10} {a:>16.6g} "
              f"{b:>16.6g} {d:>9.2%} {verdict}")
        table.append({"op": o["op"], "kernel": None, "quantity": "dram_write_op", "ncu": a, "tfhost": b,
                      "rel_diff": d, "verdict": verdict})
        if verdict.startswith("FAIL"):
            failures.append(f"{o['op']}: DRAM writes {b:.6g} against ncu's {a:.6g} ({d:.2%}), the op and the clear "
                            "after it")
    g = doc.get("gemm") or {}
    expected = 2.0 * g.get("m", 0) * g.get("n", 0) * g.get("k", 0)
    gemm_ours = sum(ours_quantities(o, rows_by_name)["flops"] for o in ours if o.get("op") == "gemm")
    gemm_ncu = sum(quantities(n)["flops"] for n, o in pairs if o.get("op") == "gemm")
    print(f"GEMM {g.get('m')}x{g.get('n')}x{g.get('k')}: 2MNK = {expected:.6g}, tfhost {gemm_ours:.6g} "
          f"({rel(expected, gemm_ours):.3%}), ncu {gemm_ncu:.6g} ({rel(expected, gemm_ncu):.3%})")
    if not expected or rel(expected, gemm_ours) > GEMM_TOLERANCE:
        failures.append(f"the GEMM's FLOPs {gemm_ours:.6g} against 2MNK {expected:.6g}")
    if not pairs:
        failures.append("no kernel of ncu's matched one of tfhost's")
    if only_ncu:
        print("only under ncu: " + ", ".join(base_name(x) for x in only_ncu))
    if only_ours:
        print("only in tfhost's counters: " + ", ".join(base_name(x) for x in only_ours))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": table, "gemm": {"expected": expected, "tfhost": gemm_ours, "ncu": gemm_ncu},
                       "only_ncu": only_ncu, "only_tfhost": only_ours, "failures": failures, "device": doc.get("device"),
                       "metrics": metrics, "missing_metrics": missing}, f, indent=1)
    for line in failures:
        print("FAIL " + line)
    print("ncu_compare.py: " + ("FAIL" if failures else "ok") + f" ({len(pairs)} kernels compared)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
