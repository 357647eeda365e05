"""experiments/attention_sweep.lua and experiments/flash_benchmark.lua from the outside, with tiny
sizes so the CPU runs take seconds: their tables, their JSON with the environment, OOM rows under a
tiny memory cap that do not stop the sweep, the memory accounting, and bad options.

    python3 tests/cli/test_attention_experiments.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None


def run(script, *args):
    return subprocess.run([TFHOST, "experiments/" + script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def run_json(test, script, *args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        r = run(script, *args, "--json", out)
        test.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return r, json.load(f)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class AttentionSweep(unittest.TestCase):
    def test_table_json_and_accounting(self):
        r, doc = run_json(self, "attention_sweep.lua", "--batch", "2", "--d", "16,32", "--seq", "32,64", "--iters",
                          "2", "--warmup", "1")
        self.assertIn("| dtype | d | seq | naive fwd ms | flash fwd ms | naive bwd ms | flash bwd ms | "
                      "naive mem before bwd | flash mem before bwd |", r.stdout)
        self.assertIn("| f32 | 32 | 64 |", r.stdout)
        self.assertIn("[8/8] f32 d 32 seq 64 flash", r.stderr)  # progress on stderr
        self.assertNotIn("OOM", r.stdout)
        rows = doc["results"]
        self.assertEqual([(x["d"], x["seq"], x["impl"]) for x in rows],
                         [(d, s, i) for d in (16, 32) for s in (32, 64) for i in ("naive", "flash")])
        for row in rows:
            for key in ("fwd_ms", "bwd_ms", "mem_mib", "fwd_peak_mib", "bwd_peak_mib"):
                self.assertTrue(is_number(row[key]) and row[key] > 0, (key, row))
            self.assertEqual((row["batch"], row["dtype"], row["causal"]), (2, "f32", True))
        # naive keeps P (B*seq^2 floats), the causal mask and O; flash keeps O and lse
        naive = next(x for x in rows if x["impl"] == "naive" and x["d"] == 32 and x["seq"] == 64)
        flash = next(x for x in rows if x["impl"] == "flash" and x["d"] == 32 and x["seq"] == 64)
        self.assertAlmostEqual(naive["mem_mib"] * 2 ** 20, 2 * 64 * 64 * 4 + 64 * 64 + 2 * 64 * 32 * 4, delta=1024)
        self.assertLess(flash["mem_mib"], naive["mem_mib"] / 2)
        acc = doc["memory_accounting"]
        self.assertEqual((acc["seq"], acc["d"]), (64, 32))
        self.assertIn("largest configuration that ran", acc["why"])
        self.assertIn("### Memory accounting: batch 2, seq 64, d 32, f32", r.stdout)
        self.assertIn("| P = softmax(S), saved for backward | 8192 | B*seq^2*4 | 32.0 KiB |", r.stdout)
        self.assertEqual(doc["env"]["options"]["seq"], [32, 64])
        self.assertIn("device", doc["env"])

    def test_out_of_memory_rows_do_not_stop_the_sweep(self):
        # 4 MiB: naive attention's 2 MiB score matrices at seq 512 need a new 20 MiB segment; flash fits
        r, doc = run_json(self, "attention_sweep.lua", "--batch", "2", "--d", "16", "--seq", "32,512", "--iters", "1",
                          "--warmup", "0", "--memory_limit", "0.004")
        self.assertIn("| f32 | 16 | 512 | OOM |", r.stdout)
        self.assertIn("OOM in forward", r.stderr)
        rows = {(x["seq"], x["impl"]): x for x in doc["results"]}
        self.assertEqual(rows[(512, "naive")]["fwd_ms"], "OOM")
        self.assertEqual(rows[(512, "naive")]["oom"], "forward")
        for key in ((32, "naive"), (32, "flash"), (512, "flash")):
            self.assertTrue(is_number(rows[key]["fwd_ms"]) and is_number(rows[key]["bwd_ms"]), rows[key])
        acc = doc["memory_accounting"]
        self.assertEqual(acc["seq"], 512)
        self.assertIn("smallest configuration where naive attention ran out of memory", acc["why"])
        self.assertIn("not measured: it ran out of memory", r.stdout)

    def test_bad_options(self):
        r = run("attention_sweep.lua", "--seq", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("option '--seq' values must be >= 1 (got 0)", r.stderr)
        r = run("attention_sweep.lua", "--impl", "fast")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--impl", r.stderr)


class FlashBenchmark(unittest.TestCase):
    def test_quick_table_and_json(self):
        r, doc = run_json(self, "flash_benchmark.lua", "--quick", "--dtype", "bf16,f32")
        self.assertIn("| dtype | d | seq | impl | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | "
                      "fwd+bwd TFLOP/s | fwd+bwd speedup vs naive |", r.stdout)
        self.assertIn("[16/16] f32 d 32 seq 128 flash", r.stderr)
        rows = doc["results"]
        self.assertEqual(len(rows), 16)  # bf16, f32 x d 16, 32 x seq 64, 128 x naive, flash
        for row in rows:
            flops = 4 * row["seq"] ** 2 * row["d"] / 2  # batch 1, heads 1, causal
            for key, factor in (("fwd", 1), ("bwd", 2.5), ("fwdbwd", 3.5)):
                ms = row[key + "_ms"]
                self.assertTrue(is_number(ms) and ms > 0, (key, row))
                self.assertAlmostEqual(row[key + "_tflops"], factor * flops / (ms * 1e-3) / 1e12,
                                       delta=1e-9 + 1e-9 * row[key + "_tflops"])
            if row["impl"] == "flash":
                self.assertTrue(is_number(row["speedup"]) and row["speedup"] > 0)
        self.assertTrue(doc["env"]["options"]["quick"])

    def test_profile(self):
        r, doc = run_json(self, "flash_benchmark.lua", "--quick", "--dtype", "f32", "--profile", "2")
        rows = doc["results"]
        self.assertEqual(len(rows), 8)
        for row in rows:
            self.assertTrue(is_number(row["kernel_ms"]) and row["kernel_ms"] > 0, row)
            title = ("### Kernels of one forward + backward call, f32 d %d seq %d %s (mean of 2 calls): %.3f ms"
                     % (row["d"], row["seq"], row["impl"], row["kernel_ms"]))
            self.assertIn(title, r.stdout)
        flash = r.stdout.split("f32 d 32 seq 128 flash (mean of 2 calls)")[1]
        if doc["env"]["device"] == "cpu":
            # on the CPU the profile's rows are the ops: the flash calls are the two flash ops, once each
            self.assertIn("| flash_attention_backward | 1 |", flash)
            self.assertIn("| flash_attention | 1 |", flash)
        else:
            # on a GPU the kernels: f32 runs the SIMT flash kernels, forward, dK/dV and dQ, once a call each
            for kernel in ("tf_flash_fwd_simt_kernel", "tf_flash_dkdv_simt_kernel", "tf_flash_dq_simt_kernel"):
                self.assertRegex(flash, r"\| %s[^|]* \| 1 \|" % kernel)
        r = run("flash_benchmark.lua", "--quick", "--profile", "-1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("option '--profile' must be >= 0 (got -1)", r.stderr)

    def test_out_of_memory_rows(self):
        r, doc = run_json(self, "flash_benchmark.lua", "--seq", "64,1024", "--d", "16", "--dtype", "f32", "--iters",
                          "1", "--warmup", "0", "--memory_limit", "0.004")
        rows = {(x["seq"], x["impl"]): x for x in doc["results"]}
        self.assertTrue(rows[(1024, "naive")]["oom"])
        self.assertEqual(rows[(1024, "naive")]["fwd_ms"], "OOM")
        self.assertIn("| f32 | 16 | 1024 | naive | OOM | OOM | OOM |", r.stdout)
        self.assertTrue(is_number(rows[(1024, "flash")]["fwdbwd_ms"]))
        self.assertNotIn("speedup", rows[(1024, "flash")])  # no naive time to compare with
        self.assertTrue(is_number(rows[(64, "flash")]["speedup"]))

    def test_bad_options(self):
        r = run("flash_benchmark.lua", "--iters", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("option '--iters' must be >= 1 (got 0)", r.stderr)
        r = run("flash_benchmark.lua", "--dtype", "f8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--dtype", r.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
