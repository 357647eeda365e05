"""experiments/kernel_bandwidth.lua accounts for what it claims: on a GPU, its byte model knows
every memory-bound kernel of the step that takes time, the calls it expects are the calls the
profile saw (so its per-call bytes describe the engine's real pass), its rows and the compute-bound
kernels add up to the step's kernel time, its rates follow from bytes and time, and its bytes and
calls are the ones the engine counts at each launch from the launch's arguments (tf.cuda.traffic),
kernel by kernel. Without a GPU
it refuses with a clear message; the GPU part is then skipped (exit 77) saying why.

    python3 tests/cli/test_kernel_bandwidth.py /path/to/tfhost
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


def run(*args):
    return subprocess.run([TFHOST, "experiments/kernel_bandwidth.lua", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


class KernelBandwidth(unittest.TestCase):
    def test_account(self):
        if not GPU:
            self.skipTest("no CUDA device")
        for precision, attention in (("bf16", "flash"), ("f32", "flash"), ("bf16", "naive")):
            with self.subTest(precision=precision, attention=attention), tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "bw.json")
                r = run("--size", "small", "--context", "256", "--precision", precision, "--attention", attention,
                        "--steps", "2", "--json", out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("| kernel | class | calls/step | GB/step | ms/step | GB/s | of copy rate |", r.stdout)
                with open(out) as f:
                    doc = json.load(f)
                env, rows = doc, doc["results"]  # the run's totals sit beside its rows
                self.assertGreater(env["copy_gbps"], 100)
                # the byte model agrees with the engine's own count, kernel by kernel
                self.assertFalse(env["model_disagreements"], env["model_disagreements"])
                self.assertIn("The byte model agrees with the engine's own count", r.stdout)
                # rows + compute-bound kernels = every kernel of the step
                total = sum(x["ms"] for x in rows) + env["compute_bound_ms"]
                self.assertAlmostEqual(total, env["kernel_ms"], delta=1e-6 * env["kernel_ms"] + 1e-9)
                self.assertAlmostEqual(sum(x["ms"] for x in rows), env["memory_bound_ms"], delta=1e-9 + 1e-6 * total)
                for x in rows:
                    share = x["ms"] / env["kernel_ms"]
                    if x.get("latency"):  # a small, fixed amount of work, named as such
                        if x.get("expected_calls") is not None:
                            self.assertEqual(x["calls"], x["expected_calls"], x["kernel"])
                        continue
                    if "bytes" not in x:
                        # only kernels too short to matter may lack a byte model
                        self.assertLess(share, 0.01, f"{x['kernel']} has no byte model and takes {share:.1%}")
                        continue
                    if x.get("expected_calls") is not None:
                        self.assertEqual(x["calls"], x["expected_calls"], x["kernel"])
                    self.assertIn("counted_bytes", x, f"{x['kernel']}: the engine does not count it")
                    self.assertAlmostEqual(x["counted_bytes"], x["bytes"], delta=1e-9 * x["bytes"], msg=x["kernel"])
                    self.assertEqual(x["counted_calls"], x["calls"], x["kernel"])
                    self.assertAlmostEqual(x["gbps"], x["bytes"] / (x["ms"] * 1e-3) / 1e9, delta=1e-6 * x["gbps"])
                    self.assertAlmostEqual(x["fraction"], x["gbps"] / env["copy_gbps"], delta=1e-9)
                    # no kernel can move its least bytes much faster than a plain copy
                    self.assertLess(x["fraction"], 1.3, x["kernel"])
                names = {x["kernel"] for x in rows}
                for k in ("tf_cuda_rms_forward_row_kernel", "tf_cuda_rms_apply_kernel", "tf_cuda_swiglu_kernel"):
                    self.assertIn(k, names)
                # the loss: a block a row for bf16 rows of 10000 (1250 vectors), the row groups for f32 (2500)
                self.assertIn("tf_cuda_ce_row_kernel" if precision == "bf16" else "tf_cuda_ce_kernel", names)
                self.assertTrue(any(n.startswith("tf_cuda_adamw") for n in names))
                # the heads layout runs under naive attention only (flash reads and writes O and dO merged)
                heads = {"tf_cuda_heads_kernel", "tf_cuda_heads_rows_kernel"} & names
                if attention == "flash":
                    self.assertEqual(heads, set(), "flash attention's backward pass splits no heads")
                else:
                    self.assertTrue(heads, "naive attention merges and splits the heads")

    def test_a_wrong_model_is_caught(self):
        """The byte model with the recomputed ln2's residual add left out, as it once was: the
        engine's count disagrees, and the script says where and exits 1 after its table."""
        if not GPU:
            self.skipTest("no CUDA device")
        with open(os.path.join(ROOT, "experiments", "kernel_bandwidth.lua")) as f:
            script = f.read()
        right = "local ln2 = (low or recompute_residual) and (nd * (4 + e + 4 + e) + 4 * n) or (nd * (4 + e) + 4 * n)"
        self.assertIn(right, script, "the recomputed ln2's bytes moved: update this test")
        with tempfile.TemporaryDirectory() as tmp:
            wrong = os.path.join(tmp, "kernel_bandwidth.lua")
            with open(wrong, "w") as f:
                f.write(script.replace(right, "local ln2 = nd * (4 + e) + 4 * n"))
            r = subprocess.run([TFHOST, wrong, "--size", "small", "--context", "128", "--precision", "bf16",
                                "--steps", "1", "--warmup", "1"], cwd=ROOT, capture_output=True, text=True,
                               timeout=600)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("| kernel | class |", r.stdout)  # the table still comes first
        self.assertIn("tf_cuda_rms_apply_kernel: the byte model says", r.stdout)
        self.assertIn("disagrees with the engine's count", r.stderr)

    def test_without_gpu_says_why(self):
        if GPU:
            self.skipTest("a CUDA device is present")
        r = run()
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs a CUDA device", r.stderr)

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--target", r.stdout)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    GPU = cuda_present(TFHOST)
    unittest.main()
