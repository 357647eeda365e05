"""experiments/mixed_precision.lua against PyTorch's answers.

tests/reference/torch_mixed_precision.py, run with torch on a GPU, wrote
tests/reference/oracles/mixed_precision.json: the CS336 accumulation sums, the
dtypes of the ToyModel under f16/bf16 autocast, and the output dtype of each op
under autocast. tfhost must give the very same sums and dtypes (on any device).

    python3 tests/cli/test_mixed_precision.py /path/to/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.path.join(ROOT, "tests", "reference", "oracles", "mixed_precision.json")
TFHOST = None

# The ops of torch_mixed_precision.py's op_policy(), written with tf.
OP_POLICY_LUA = r"""
local out = {}
for _, low in ipairs({"f16", "bf16"}) do
  local h = tf.rand({3, 4}, {dtype = low}) + 1
  local f = tf.rand(3, 4) + 1
  local w = tf.rand(5, 4)
  local ops = tf.autocast(low, function()
    return {
      ["matmul f32"] = tf.matmul(f, f:t()), ["linear f32"] = tf.linear(f, w, tf.rand(5)),
      exp = h:exp(), log = h:log(), rsqrt = h:rsqrt(), pow = h ^ 2, sum = h:sum(),
      softmax = h:softmax(-1), log_softmax = h:log_softmax(-1), layer_norm = tf.layer_norm(h),
      relu = h:relu(), sqrt = h:sqrt(), sigmoid = h:sigmoid(), mean = h:mean(), max = h:max(),
      ["add mixed"] = h + f, ["mul scalar"] = h * 2, silu = h:silu(), gelu = h:gelu(), tanh = h:tanh(),
    }
  end)
  out[low] = {}
  for k, v in pairs(ops) do out[low][k] = v.dtype end
end
print(tf.json.encode(out))
"""


class MixedPrecisionMatchesPyTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(ORACLE) as f:
            cls.oracle = json.load(f)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "mp.json")
            # all four sections; section 4's model kept small so that the CPU run is quick
            run = subprocess.run([TFHOST, "experiments/mixed_precision.lua", "--json", out, "--d_model", "64",
                                  "--tokens", "128", "--layers", "2", "--warmup", "1", "--steps", "2"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                raise AssertionError("the experiment failed:\n" + run.stdout + run.stderr)
            with open(out) as f:
                cls.tf = json.load(f)["results"]

    def test_accumulation_sums_are_identical(self):
        mine = {r["case"]: r for r in self.tf["accumulation"]}
        for row in self.oracle["accumulation"]:
            got = mine[row["case"]]
            self.assertEqual(got["dtype"], row["dtype"], row["case"])
            self.assertEqual(got["sum"], row["sum"], row["case"])  # bit-identical arithmetic

    def test_toy_model_dtypes_are_identical(self):
        mine = {r["autocast"]: r for r in self.tf["autocast_dtypes"]}
        for row in self.oracle["autocast_dtypes"]:
            got = mine[row["autocast"]]
            for key in ("parameters", "fc1", "relu", "ln", "logits", "loss", "gradients"):
                self.assertEqual(got[key], row[key], f"{row['autocast']}: {key}")

    def test_layer_norm_section_shows_f32_statistics_win(self):
        rows = self.tf["layer_norm"]
        self.assertEqual(len(rows), 9)
        for row in rows:
            if row["dtype"] != "f32":  # in f32 both are at rounding level, either may be smaller
                self.assertLessEqual(row["fused"], row["eager"], row)
        large_f16 = [r for r in rows if r["dtype"] == "f16" and r["input"].startswith("large")][0]
        self.assertGreater(large_f16["eager"], 1.0)   # x^2 overflowed in f16
        self.assertLess(large_f16["fused"], 1e-2)

    def test_timing_section_has_both_precisions(self):
        rows = self.tf["timing"]
        self.assertEqual([r["precision"] for r in rows], ["f32", "bf16"])
        for row in rows:
            # only that each was measured: how the times compare depends on the machine's load
            self.assertGreater(row["forward_ms"], 0)
            self.assertGreater(row["forward_backward_ms"], 0)
        self.assertGreater(rows[1]["speedup"], 0)

    def test_each_op_follows_the_autocast_policy(self):
        run = subprocess.run([TFHOST, "-e", OP_POLICY_LUA], cwd=ROOT, capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        mine = json.loads(run.stdout)
        for low, ops in self.oracle["op_policy"].items():
            for op, dtype in ops.items():
                self.assertEqual(mine[low][op], dtype, f"{op} under {low} autocast")


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    if not os.path.exists(ORACLE):
        print("SKIP: no PyTorch oracle at " + ORACLE + " (run tests/reference/torch_mixed_precision.py on a GPU)")
        sys.exit(77)
    unittest.main()
