"""experiments/benchmark.lua from the outside: its table, its JSON with the environment,
OOM rows that do not stop the sweep, and bad options. The tiny preset keeps the CPU run quick.

    python3 tests/cli/test_benchmark.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None
GPU = False


def run(*args):
    return subprocess.run([TFHOST, "experiments/benchmark.lua", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


class Benchmark(unittest.TestCase):
    def test_rows_table_and_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "b.json")
            r = run("--size", "tiny", "--context", "16", "--batch", "2", "--steps", "2", "--warmup", "0,1",
                    "--mode", "fwd,step", "--precision", "f32", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| size | ctx | prec | impl | mode | warmup | mean ms |", r.stdout)
            self.assertIn("[2/2] tiny ctx 16 f32 warmup 1", r.stderr)  # progress on stderr
            with open(out) as f:
                doc = json.load(f)
        rows = doc["results"]
        self.assertEqual([(x["mode"], x["warmup"]) for x in rows], [("fwd", 0), ("step", 0), ("fwd", 1), ("step", 1)])
        params = 2 * 10000 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64
        for row in rows:
            self.assertGreater(row["mean_ms"], 0)
            self.assertEqual(row["params"], params)
            self.assertGreater(row["peak_gib"] * 2 ** 30, params * 4)  # at least the f32 parameters
        self.assertIn("device", doc["env"])
        self.assertEqual(doc["env"]["options"]["size"], ["tiny"])

    def test_out_of_memory_rows_do_not_stop_the_sweep(self):
        # 4 MiB cannot hold the tiny model's parameters (5.5 MiB); the sweep goes on to the next size
        r = run("--size", "tiny,tiny", "--context", "8", "--batch", "1", "--steps", "1", "--warmup", "0",
                "--mode", "fwd", "--precision", "f32", "--memory_limit", "0.004")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("| tiny | 8 | f32 |"), 2)
        self.assertEqual(r.stdout.count("OOM"), 2)  # the mean column of both rows
        self.assertIn("OOM (", r.stderr)

    def test_modes_that_ran_before_out_of_memory_keep_their_rows(self):
        # 40 MiB holds the tiny model's forward and backward at context 16 on the CPU, not the optimizer's state
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "b.json")
            r = subprocess.run([TFHOST, "--device", "cpu", "experiments/benchmark.lua", "--size", "tiny", "--context",
                                "16", "--steps", "1", "--warmup", "0", "--precision", "f32", "--memory_limit", "0.04",
                                "--json", out], cwd=ROOT, capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                rows = json.load(f)["results"]
        self.assertEqual(sorted(x["mode"] for x in rows), ["fwd", "fwdbwd", "step"], "one row per mode")
        by_mode = {x["mode"]: x for x in rows}
        self.assertIsInstance(by_mode["fwd"]["mean_ms"], float)
        self.assertEqual((by_mode["step"].get("oom"), by_mode["step"]["mean_ms"]), (True, "OOM"))

    def test_tf32_is_refused_on_the_cpu(self):
        r = subprocess.run([TFHOST, "--device", "cpu", "experiments/benchmark.lua", "--size", "tiny", "--tf32"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("--tf32 is a mode of CUDA's tensor cores", r.stderr)

    def test_tf32_rows_say_so(self):
        if not GPU:
            self.skipTest("no CUDA device")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "b.json")
            r = run("--size", "tiny", "--context", "16", "--steps", "1", "--warmup", "0", "--mode", "fwd",
                    "--precision", "f32,bf16", "--tf32", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| tiny | 16 | f32+tf32 |", r.stdout)
            with open(out) as f:
                doc = json.load(f)
        self.assertEqual([x["precision"] for x in doc["results"]], ["f32+tf32", "bf16"])  # bf16 runs keep their name
        self.assertIs(doc["env"]["options"]["tf32"], True)

    def test_bad_options(self):
        r = run("--size", "huge")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown size 'huge'", r.stderr)
        r = run("--precision", "f8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--precision", r.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    GPU = cuda_present(TFHOST)
    unittest.main()
