"""experiments/benchmark.lua from the outside: its table, its JSON with the environment,
OOM rows that do not stop the sweep, and bad options. Tiny settings so that the CPU run is quick.

    python3 tests/cli/test_benchmark.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None


def run(*args):
    return subprocess.run([TFHOST, "experiments/benchmark.lua", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


class Benchmark(unittest.TestCase):
    def test_rows_table_and_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "b.json")
            r = run("--size", "small", "--context", "8", "--batch", "1", "--steps", "2", "--warmup", "0,1",
                    "--mode", "fwd,step", "--precision", "f32", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| size | ctx | prec | impl | mode | warmup | mean ms |", r.stdout)
            self.assertIn("[2/2] small ctx 8 f32 warmup 1", r.stderr)  # progress on stderr
            with open(out) as f:
                doc = json.load(f)
        rows = doc["results"]
        self.assertEqual([(x["mode"], x["warmup"]) for x in rows], [("fwd", 0), ("step", 0), ("fwd", 1), ("step", 1)])
        for row in rows:
            self.assertGreater(row["mean_ms"], 0)
            self.assertEqual(row["params"], 128625408)
            self.assertGreater(row["peak_gib"], 0.45)  # the parameters alone are 0.48 GiB
        self.assertIn("device", doc["env"])
        self.assertEqual(doc["env"]["options"]["size"], ["small"])

    def test_out_of_memory_rows_do_not_stop_the_sweep(self):
        # 0.3 GiB cannot hold the small model's parameters (0.48 GiB)
        r = run("--size", "small,medium", "--context", "8", "--batch", "1", "--steps", "1", "--warmup", "0",
                "--mode", "fwd", "--precision", "f32", "--memory_limit", "0.3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| small | 8 | f32 |", r.stdout)
        self.assertIn("| medium | 8 | f32 |", r.stdout)
        self.assertEqual(r.stdout.count("OOM"), 2)  # the mean column of both rows
        self.assertIn("OOM (", r.stderr)

    def test_bad_options(self):
        r = run("--size", "tiny")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown size 'tiny'", r.stderr)
        r = run("--precision", "f8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--precision", r.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
