"""The decode step's chained launches (kernels that start before the one ahead of them ends and wait
inside) change when kernels run, never what they compute: on a GPU, the prefill's and every decode step's
logits (eager, captured and replayed steps, batch 1 through the one-row products and batch 3 through
cuBLASLt's) and greedy generation's tokens have the same bits with TF_DECODE_CHAIN=0 (plain launches) as
with the default. A chained kernel that read its input before the kernel ahead wrote it would show up as
other bits. Skips, saying so, without a GPU.

    python3 tests/cli/test_decode_chain.py /path/to/tfhost
"""
import os
import subprocess
import sys
import tempfile
import unittest

from cuda_present import cuda_present

TFHOST = None

# Writes every logit of the prefill and of 40 decode steps, as %a (exact), and the tokens of a greedy
# generation, for bf16 and f32 models of 12 layers at batch 1 and 3.
SCRIPT = r"""
local out = assert(io.open(arg[1], "w"))
for _, prec in ipairs{ "bf16", "f32" } do
  tf.seed(11)
  local m = tf.model.new{ preset = "small", context_length = 128, precision = prec, device = "cuda", impl = "fused" }
  local V = m.config.vocab_size
  for _, batch in ipairs{ 1, 3 } do
    local rows = {}
    for b = 1, batch do
      rows[b] = {}
      for t = 1, 9 do rows[b][t] = (b * 7919 + t * 104729) % V end
    end
    local function dump(logits)
      for _, row in ipairs(logits:to("cpu", "f32"):tolist()) do
        for _, v in ipairs(row) do out:write(string.format("%a ", v)) end
        out:write("\n")
      end
    end
    dump(m.engine:prefill(tf.tensor(rows, { dtype = "i64", device = "cuda" }), 64))
    for step = 1, 40 do
      local ids = {}
      for b = 1, batch do ids[b] = (b * 31 + step * 17) % V end
      dump(m.engine:decode_step(ids))
    end
    local ids = m:generate(tf.tensor(rows, { dtype = "i64", device = "cuda" }), { max_new_tokens = 24 })
    for _, r in ipairs(ids:to("cpu"):tolist()) do out:write(table.concat(r, " "), "\n") end
  end
end
out:close()
"""


class DecodeChain(unittest.TestCase):
    def run_with(self, tmp, chain):
        script = os.path.join(tmp, "chain.lua")
        with open(script, "w") as f:
            f.write(SCRIPT)
        path = os.path.join(tmp, f"logits-{chain}.txt")
        env = dict(os.environ, TF_DECODE_CHAIN=chain)
        r = subprocess.run([TFHOST, script, path], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        with open(path) as f:
            return f.read().splitlines()

    def test_chained_steps_have_the_plain_steps_bits(self):
        with tempfile.TemporaryDirectory() as tmp:
            plain, chained = self.run_with(tmp, "0"), self.run_with(tmp, "1")
        # 2 precisions x (batch 1 + batch 3) x (41 logit rows a row of the batch + the generated rows)
        self.assertEqual(len(plain), 2 * (41 * 1 + 1 + 41 * 3 + 3))
        differ = [i for i, (a, b) in enumerate(zip(plain, chained)) if a != b]
        self.assertEqual(len(plain), len(chained))
        self.assertEqual(differ, [], f"{len(differ)} of {len(plain)} lines differ, the first at line {differ[:1]}")


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    if not cuda_present(TFHOST):
        print("SKIP: no CUDA device (chained launches are the GPU's)")
        sys.exit(77)
    unittest.main()
