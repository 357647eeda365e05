"""Every experiment of experiments/, at tiny sizes, gives the same results under tfhost --safe as
without it: the same fields, and every value two plain runs agree on (everything computed; measured
times differ from run to run). The sandbox's own checks are in test_safe.py, whose scratch tree this
file uses.

    python3 tests/cli/test_safe_experiments.py /path/to/tfhost
"""
import glob
import json
import os
import shutil
import sys
import unittest

import test_safe
from test_safe import ROOT, Sandbox

# Every experiment with tiny sizes (CPU seconds), and what each writes besides its JSON.
EXPERIMENTS = [
    ("hello.lua", ["--size", "64", "--iters", "1"], []),
    ("benchmark.lua", ["--size", "tiny", "--context", "16", "--batch", "2", "--steps", "1", "--warmup", "0",
                       "--mode", "fwd,step", "--precision", "f32"], []),
    ("attention_sweep.lua", ["--batch", "1", "--d", "16", "--seq", "32", "--iters", "1", "--warmup", "0"], []),
    ("flash_benchmark.lua", ["--quick", "--iters", "1", "--warmup", "0"], []),
    ("fused_vs_eager.lua", ["--quick", "--part", "attention", "--iters", "1", "--warmup", "0"], []),
    ("memory_profile.lua", ["--size", "tiny", "--context", "16", "--precision", "f32", "--batch", "1",
                            "--mode", "forward", "--out", "snaps/deeper"], ["snaps/deeper"]),
    ("mixed_precision.lua", ["--d_model", "64", "--layers", "1", "--steps", "1"], []),
    ("overhead.lua", ["--size", "tiny", "--context", "16", "--batch", "1", "--steps", "1", "--rounds", "3",
                      "--precision", "f32"], []),
    ("profile_kernels.lua", ["--size", "tiny", "--context", "16", "--batch", "1", "--warmup", "0", "--passes", "1",
                             "--precision", "f32", "--impl", "fused", "--trace", "traces"], ["traces"]),
    ("kernel_bandwidth.lua", ["--size", "tiny", "--context", "16", "--batch", "1", "--warmup", "1", "--steps", "1"],
     []),
    ("allreduce.lua", ["--sizes", "1", "--iters", "1", "--warmup", "0"], []),
    ("ddp.lua", ["--context", "16", "--batch", "1", "--steps", "1", "--warmup", "0", "--variants", "none,flat,zero1",
                 "--bucket_mb", "1"], []),
    ("make_bytes_dataset.lua", ["--from", os.path.join(ROOT, "experiments", "kernels"), "--ext", "cu", "--out",
                                "bytes", "--parts", "2"], ["bytes"]),
    ("train.lua", ["--from", os.path.join(ROOT, "experiments", "kernels"), "--ext", "cu", "--data", "bytes", "--context", "16",
                   "--batch", "2", "--steps", "6", "--eval_every", "3", "--eval_tokens", "64", "--checkpoint_every", "3",
                   "--out", "run"], ["bytes", "run/checkpoints"]),
    ("own_kernel.lua", ["--parts", "softmax,flash", "--rows", "8", "--widths", "256", "--shapes", "1x1x64x64",
                        "--iters", "1"], []),
    ("generate.lua", ["--preset", "tiny", "--context", "32", "--prompt", "ab", "--max_new_tokens", "4"], []),
    ("decode_benchmark.lua", ["--size", "tiny", "--batch", "1", "--prompt", "4", "--new_tokens", "3"], []),
    ("gemm_benchmark.lua", ["--shapes", "32x32x32", "--kinds", "bf16,fp8", "--warmup", "0", "--iters", "1"], []),
]
# What --safe needs beside it for an experiment to run at all: own_kernel.lua compiles kernels.
SAFE_FLAGS = {"own_kernel.lua": ["--allow-kernels"]}
# Experiments that refuse, with and without --safe, on a tfhost built without the CUDA backend.
NEEDS_CUDA_BUILD = {"own_kernel.lua"}
# Fields ranked or clamped by measured time (which kernel leads, which come next, and so how many
# come next): two plain runs can agree on them by chance and a third differ, so they are not results
# a run must reproduce.
TIME_RANKED = {"profile_kernels.lua": ("/non_gemm/", "/fwd_top", "/step_top", "/same_leader"),
               # a step's time beyond the baseline's, clamped at 0 (and the share hidden, 100 then):
               # two runs agree on 0 by chance
               "ddp.lua": ("/exposed_ms", "/hidden_pct")}
# Measured times (a field named *_ms, *_us or *_s) and the rates and ratios made of them (*tflops,
# *gbps, *speedup, time_ratio, fraction of the copy rate): a timer ticks in steps (tens of
# nanoseconds), so two runs of a short section can read the same time by chance and a third not
# (flash_benchmark.lua's fwd_tflops at one iteration did).
TIMED_SUFFIXES = ("_ms", "_us", "_s", "tflops", "gbps", "speedup", "time_ratio", "fraction")
# Fields named for a time alone, and a verdict on a measured rate (kernel_bandwidth.lua's ms and meets)
TIMED_NAMES = ("ms", "us", "meets")
# Experiments whose rows are sorted by measured time: their rows are compared by these key fields, not by place
ROW_KEYS = {"kernel_bandwidth.lua": ("kernel", "class")}


def time_dependent(path, ranked):
    """Whether a flattened field is a measured time or ranked by one."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(TIMED_SUFFIXES) or name in TIMED_NAMES or any(part in path for part in ranked)


# Experiments that need a GPU: without one, they must refuse alike with and without --safe.
NEEDS_GPU = {"kernel_bandwidth.lua"}


def flatten(value, path=""):
    """{"rows/0/ms": 1.5, ...}: every leaf of a results document by its path."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{path}/{i}").items()}
    return {path: value}


def untimed_fields(results, ranked):
    """The paths of a flattened results document, but those under a time-ranked field."""
    return sorted(k for k in results if not any(part in k for part in ranked))


class Experiments(Sandbox):
    """Same results: the same fields, and every value that two runs without --safe agree on
    (everything computed; timings differ from run to run) is the value under --safe."""

    def results(self, script, args, outputs, mode, run):
        cwd = os.path.join(self.top, f"run{run}")
        shutil.rmtree(cwd, ignore_errors=True)
        os.makedirs(cwd)
        r = self.tfhost(*mode, "--seed", "7", os.path.join(ROOT, "experiments", script), *args, "--json", "r.json",
                        cwd=cwd)
        self.assertEqual(r.returncode, 0, f"{script} {mode}: {r.stderr[-2000:]}")
        for out in outputs:
            self.assertTrue(os.listdir(os.path.join(cwd, out)), f"{script} {mode} wrote nothing in {out}")
        with open(os.path.join(cwd, "r.json")) as f:
            rows = json.load(f)["results"]
        if script in ROW_KEYS:
            rows = {"|".join(str(row.get(k)) for k in ROW_KEYS[script]): row for row in rows}
        return flatten(rows)

    def test_every_experiment_gives_the_same_results_under_safe(self):
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "experiments", "*.lua")))
        self.assertEqual(names, sorted(e[0] for e in EXPERIMENTS), "an experiment is missing from this test")
        gpu = self.tfhost("-e", "io.write(tostring(tf.cuda.is_available()))").stdout == "true"
        compiled = self.tfhost("-e", "io.write(tostring(tf.cuda.compiled()))").stdout == "true"
        for script, args, outputs in EXPERIMENTS:
            with self.subTest(experiment=script):
                if script in NEEDS_GPU and not gpu:
                    path = os.path.join(ROOT, "experiments", script)
                    plain, safe = self.tfhost(path, *args), self.tfhost("--safe", path, *args)
                    limits, _, refusal = safe.stderr.partition("\n")  # --safe's first line: its limits
                    self.assertIn("tfhost: safe mode:", limits)
                    self.assertEqual((plain.returncode, plain.stderr), (2, refusal), script)
                    self.assertEqual(safe.returncode, 2, script)
                    self.assertIn("needs a CUDA device", safe.stderr)
                    continue
                if script in NEEDS_CUDA_BUILD and not compiled:
                    path = os.path.join(ROOT, "experiments", script)
                    for mode in ([], ["--safe"] + SAFE_FLAGS.get(script, [])):
                        r = self.tfhost(*mode, path, *args)
                        self.assertEqual(r.returncode, 2, f"{script} {mode}: {r.stderr}")
                        self.assertIn("built without CUDA", r.stderr)
                    continue
                if script in SAFE_FLAGS:  # without its flag --safe refuses, naming it
                    r = self.tfhost("--safe", os.path.join(ROOT, "experiments", script), *args)
                    self.assertEqual(r.returncode, 1, f"{script} --safe: {r.stderr[-2000:]}")
                    self.assertIn(SAFE_FLAGS[script][0], r.stderr)
                plain = self.results(script, args, outputs, [], 1)
                again = self.results(script, args, outputs, [], 2)
                safe = self.results(script, args, outputs, ["--safe"] + SAFE_FLAGS.get(script, []), 3)
                ranked = TIME_RANKED.get(script, ())
                # how many kernels a time-ranked list holds (those past a share of the time) can differ too
                self.assertEqual(untimed_fields(safe, ranked), untimed_fields(plain, ranked),
                                 f"{script}: other fields under --safe")
                reproducible = {k: v for k, v in plain.items() if again.get(k) == v and not time_dependent(k, ranked)}
                self.assertTrue(reproducible, script)
                self.assertEqual({k: safe[k] for k in reproducible}, reproducible, script)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_safe_experiments.py /path/to/tfhost [unittest options]")
    test_safe.TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
