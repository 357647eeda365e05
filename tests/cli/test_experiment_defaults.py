"""Every experiment of experiments/ run as a first user runs it on a CPU: no options but --json. Its
CPU defaults (tf.options' `cpu = ...`, shown by --help) must finish in well under two minutes, with a
progress line that says what is left and a results file marked complete; kernel_bandwidth.lua, which
measures GPU kernels, refuses at once. The measured times are printed. The experiments that train
the Transformer LM are in test_experiment_defaults_models.py (the same test over its own list), so
that each file stays well inside ctest's time limit.

    python3 tests/cli/test_experiment_defaults.py /path/to/tfhost
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None
LIMIT_S = 90  # each experiment's CPU defaults; on an idle 2-core machine each takes 0.3 to 10 s
NEEDS_GPU = {"kernel_bandwidth.lua"}
NEEDS_CUDA_BUILD = {"own_kernel.lua"}  # compiles its kernels on a CPU too, with the CUDA backend's NVRTC
NOT_HERE = {"profile_kernels.lua"}  # its defaults are tested with it (tests of tf.prof)
MODELS = {"benchmark.lua", "memory_profile.lua", "mixed_precision.lua", "overhead.lua", "ddp.lua", "train.lua"}


def experiments(models):
    """The experiments this file runs: those that train the model, or the others."""
    scripts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "experiments", "*.lua")))
    return [s for s in scripts if s not in NOT_HERE and (s in MODELS) == models]


class CpuDefaults(unittest.TestCase):
    MODELS = False

    def test_every_experiment_finishes_quickly_at_its_cpu_defaults(self):
        times = {}
        compiled = subprocess.run([TFHOST, "-e", "io.write(tostring(tf.cuda.compiled()))"], capture_output=True,
                                  text=True).stdout == "true"
        for script in experiments(self.MODELS):
            with self.subTest(experiment=script), tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "r.json")
                t0 = time.time()
                r = subprocess.run([TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", script), "--json",
                                    out], cwd=tmp, capture_output=True, text=True, timeout=LIMIT_S + 60)
                times[script] = time.time() - t0
                if script in NEEDS_GPU:
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("needs a CUDA device", r.stderr)
                    continue
                if script in NEEDS_CUDA_BUILD and not compiled:
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("built without CUDA", r.stderr)
                    continue
                self.assertEqual(r.returncode, 0, r.stderr[-3000:])
                self.assertLess(times[script], LIMIT_S, f"{script} at its CPU defaults")
                with open(out) as f:
                    doc = json.load(f)
                if script in ("hello.lua", "generate.lua"):  # no sweep: their file is written once, at the end
                    self.assertNotIn("complete", doc)
                    continue
                self.assertIs(doc["complete"], True, script)
                self.assertEqual(doc["progress"]["done"], doc["progress"]["total"], script)
                self.assertGreater(doc["progress"]["total"], 1, script)
                self.assertRegex(r.stderr, r"\[1/\d+\] .*\([\d.]+ s; about [^)]+ left\)", script)
        print("CPU defaults, seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), file=sys.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
