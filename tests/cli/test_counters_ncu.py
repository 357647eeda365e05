"""tfhost's hardware counters agree with Nsight Compute's: tests/reference/ncu_compare.py counts a bf16 GEMM,
FlashAttention forward and backward, RMSNorm, SwiGLU, AdamW and cross-entropy under ncu and under
tfhost's counters, both counting by passes (tf.prof.count with sass = true, ncu's application replay) and
both replaying kernels (tf.prof.start{metrics = "roofline"}, ncu's kernel replay; DRAM writes are not
judged there), and fails where DRAM bytes or FLOPs differ by more than 3 % or the GEMM's FLOPs differ
from 2 M N K by more than 1 %. Without a GPU, or without ncu on the PATH, the test is
skipped, saying which.

    python3 tests/cli/test_counters_ncu.py /path/to/tfhost
"""
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None


class CountersAgainstNcu(unittest.TestCase):
    def compare(self, *extra):
        if not cuda_present(TFHOST):
            print("SKIP test_counters_ncu: no CUDA device", file=sys.stderr)
            self.skipTest("no CUDA device")
        if not shutil.which("ncu"):
            print("SKIP test_counters_ncu: no ncu (Nsight Compute) on the PATH", file=sys.stderr)
            self.skipTest("no ncu on the PATH")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "reference", "ncu_compare.py"), TFHOST,
                            *extra], cwd=ROOT, capture_output=True, text=True, timeout=3600)
        print(r.stdout[-6000:], file=sys.stderr)
        self.assertNotEqual(r.returncode, 77, r.stderr)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        self.assertIn("ncu_compare.py: ok", r.stdout)

    def test_counters_match_ncu_by_pass(self):
        self.compare()

    def test_counters_match_ncu_replaying_kernels(self):
        self.compare("--replay", "kernel")


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
