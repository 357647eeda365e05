"""experiments/decode_benchmark.lua --profile accounts for a decode step: on the CPU (--device cpu, also
where a GPU is present; tiny model, two
layers), the kernel table of the engine's "decode step" ranges has the step's ops (the products, the
attention over the cache and the cache's append once a layer, the norms), its classes' times add up to
the step's kernel time, and that time is within the step's wall time (the CPU runs one op after the
other).

    python3 tests/cli/test_decode_profile.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None


class DecodeProfile(unittest.TestCase):
    def test_profile_accounts_for_the_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "decode.json")
            r = subprocess.run([TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", "decode_benchmark.lua"),
                                "--size", "tiny",
                                "--batch", "1", "--new_tokens", "12", "--profile", "--json", out],
                               cwd=tmp, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
            self.assertIn("a decode step's kernels", r.stdout)
            with open(out) as f:
                row = json.load(f)["results"][0]
        prof = row["profile"]
        self.assertEqual(prof["steps"], 11)  # 12 new tokens: the prefill's, then 11 decode steps
        layers = 2  # the tiny preset
        by_name = {k["name"]: k for k in prof["kernels"]}
        by_class = {c["name"]: c for c in prof["classes"]}
        for name in ("gemm", "decode_attention", "kv_append", "rmsnorm", "swiglu"):
            self.assertIn(name, by_name, f"{name} in the step's kernels: {sorted(by_name)}")
        self.assertEqual(by_name["decode_attention"]["per_step"], layers)
        self.assertEqual(by_name["kv_append"]["per_step"], layers)
        self.assertEqual(by_name["gemm"]["per_step"], 4 * layers + 1)  # qkv, out, w1|w3, w2 a layer; the head
        total = sum(c["us"] for c in prof["classes"])
        self.assertAlmostEqual(total, prof["kernel_us_per_step"], delta=1e-6 * total + 1e-9)
        self.assertAlmostEqual(sum(c["pct"] for c in prof["classes"]), 100.0, delta=1e-6)
        self.assertGreater(prof["kernel_us_per_step"], 0)
        self.assertLessEqual(prof["kernel_us_per_step"], prof["ms_per_step_profiled"] * 1e3,
                             "kernel time a step within the step's wall time")
        self.assertIn("attention", by_class)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
