"""The GEMM's timed choice of algorithm (TF_GEMM_TUNE=1; off by default) changes how long the engine's
products take: on a GPU, four training steps of the fused engine give the same losses, bit for bit, with
the choice on and off (the default), and tf.cuda.gemm_tuning() reports what the choice did (shapes timed,
algorithms tried and kept) in the first run and nothing in the second. (Over 200 steps it does not always:
see docs/api.md.) Without a GPU, tf.cuda.gemm_tuning() says there is none; the GPU part is then skipped,
saying why.

    python3 tests/cli/test_gemm_timed.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None

STEPS = r"""
local precision = ...
tf.seed(0)
local m = tf.model.new{ preset = "small", context_length = 128, vocab_size = 1000, precision = precision,
  impl = "fused" }
local ids = tf.randint(0, 1000, { 4, 128 })
local targets = tf.randint(0, 1000, { 4, 128 })
local losses = {}
for i = 1, 4 do
  local loss = m:step(ids, targets)
  losses[i] = string.format("%a", loss:item())
  loss:free()
end
print(tf.json.encode{ losses = losses, tuning = tf.cuda.gemm_tuning() })
"""


def run(script, *args, env=None):
    return subprocess.run([TFHOST, "-e", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)


def steps(precision, tune):
    env = dict(os.environ)
    env.pop("TF_GEMM_TUNE", None)
    if tune:
        env["TF_GEMM_TUNE"] = "1"
    r = subprocess.run([TFHOST, "-"], input=STEPS.replace("local precision = ...", f'local precision = "{precision}"'),
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


class GemmTimed(unittest.TestCase):
    def test_same_bits_either_way(self):
        if not GPU:
            self.skipTest("no CUDA device")
        for precision in ("bf16", "f32"):
            with self.subTest(precision=precision):
                on, off = steps(precision, True), steps(precision, False)
                self.assertEqual(on["losses"], off["losses"])
                self.assertEqual(len(set(on["losses"])), 4)  # the steps did train
                t = on["tuning"]
                self.assertTrue(t["enabled"])
                # the engine's products: qkv, the output projection, w1|w3, w2 and lm_head
                # forward, and their gradients
                self.assertGreaterEqual(t["shapes"], 5)
                self.assertLessEqual(t["changed"], t["shapes"])
                self.assertLessEqual(t["refused"] + t["other_bits"], t["candidates"])
                self.assertGreater(t["first_ms"], 0)
                self.assertLessEqual(t["chosen_ms"], t["first_ms"])
                self.assertFalse(off["tuning"]["enabled"])
                self.assertEqual(off["tuning"]["shapes"], 0)
                self.assertEqual(off["tuning"]["candidates"], 0)

    def test_without_gpu_says_why(self):
        if GPU:
            self.skipTest("a CUDA device is present")
        r = run("tf.cuda.gemm_tuning()")
        self.assertEqual(r.returncode, 1)
        self.assertIn("tf.cuda.gemm_tuning: no CUDA device", r.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    GPU = cuda_present(TFHOST)
    unittest.main()
