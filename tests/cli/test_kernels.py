"""tf.cuda.compile from the command line: a compile error in a kernel at line 40 of a script is
reported at the script's line and exits 1; --safe refuses to compile without --allow-kernels; and on
a GPU a kernel that faults (an out-of-bounds write, a trap, a failed device assert) is reported with
its name and the script line that launched it, after which tfhost exits 1 at once: no hang, no core
dump, under --safe --allow-kernels too. Each fault runs in a child tfhost.

    python3 tests/cli/test_kernels.py /path/to/tfhost
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

TFHOST = None
CRASH_SIGNS = ("PANIC", "unprotected error", "Segmentation", "core dumped", "Aborted")


def compiled_with_cuda():
    r = subprocess.run([TFHOST, "-e", "io.write(tostring(tf.cuda.compiled()))"], capture_output=True, text=True,
                       timeout=60)
    return r.stdout.strip() == "true"


class Kernels(unittest.TestCase):
    def setUp(self):
        if not compiled_with_cuda():
            self.skipTest("this tfhost was built without CUDA (no NVRTC)")
        tmp = tempfile.TemporaryDirectory(prefix="tfhost-kernels-")
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.env = dict(os.environ, TFHOST_KERNEL_CACHE=os.path.join(self.dir, "cache"))

    def script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_tfhost(self, *args, timeout=120):
        return subprocess.run([TFHOST, *args], capture_output=True, text=True, timeout=timeout, cwd=self.dir,
                              env=self.env)

    def test_compile_error_at_the_scripts_line(self):
        # the long string starts on line 40 (its text on line 41); the error is on the source's third line
        lines = ["-- filler"] * 39
        lines += ["local mod = tf.cuda.compile([[",
                  'extern "C" __global__ void k(float *x) {',
                  "  int i = threadIdx.x;",
                  "  x[i] = not_declared;",
                  "}]])"]
        path = self.script("exp.lua", "\n".join(lines) + "\n")
        r = self.run_tfhost(path)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("exp.lua:43: tf.cuda.compile: ", r.stderr)
        self.assertIn('identifier "not_declared" is undefined', r.stderr)
        self.assertIn("stack traceback", r.stderr)

    def test_safe_refuses_kernels_unless_allowed(self):
        path = self.script("k.lua", 'local m = tf.cuda.compile([[extern "C" __global__ void k() {}]], {cache = false})\n'
                                    'print("compiled " .. #m:kernels())\n')
        r = self.run_tfhost("--safe", path)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--safe: tf.cuda.compile is not available (a kernel can read and write any GPU memory", r.stderr)
        self.assertIn("--allow-kernels", r.stderr)
        r = self.run_tfhost("--safe", "--allow-kernels", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("compiled 1", r.stdout)
        r = self.run_tfhost("--allow-kernels", path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--allow-kernels needs --safe", r.stderr)

    def test_safe_refuses_a_kernel_the_cache_holds(self):
        path = self.script("cached.lua", 'tf.cuda.compile([[extern "C" __global__ void c(float *x) {}]])\nprint("ok")\n')
        self.assertEqual(self.run_tfhost(path).returncode, 0)  # now in the disk cache
        r = self.run_tfhost("--safe", path)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--safe: tf.cuda.compile is not available", r.stderr)
        self.assertNotIn("ok", r.stdout)

    FAULTS = {
        "out_of_bounds": ("x[(long long)1 << 36] = 1.0f;", "illegal memory access"),
        "trap": ("__trap();", "unspecified launch failure"),
        "assert": ("assert(x[0] == 12345.0f);", "device-side assert"),
    }

    def test_a_faulting_kernel_ends_tfhost_cleanly(self):
        if not cuda_present(TFHOST):
            self.skipTest("no GPU is present: the faults need one")
        for name, (body, words) in self.FAULTS.items():
            for flags in ([], ["--safe", "--allow-kernels"]):
                with self.subTest(fault=name, flags=flags):
                    path = self.script(f"fault_{name}.lua", "\n".join([
                        "local mod = tf.cuda.compile([[",
                        "#include <tfhost.cuh>",
                        'extern "C" __global__ void faulty(float *x) {',
                        f"  {body}",
                        "}]])",
                        "local x = tf.zeros(4, {device = 'cuda'})",
                        "mod:kernel('faulty'):launch({grid = 1, block = 1}, x)",
                        "print(x:sum():item())",
                        "print('not reached')",
                    ]) + "\n")
                    r = self.run_tfhost(*flags, path, timeout=120)
                    self.assertEqual(r.returncode, 1, r.stderr)
                    self.assertNotIn("not reached", r.stdout)
                    self.assertIn("the CUDA context is now unusable", r.stderr)
                    self.assertIn(f"faulty, launched at {path}:7", r.stderr)
                    self.assertIn(words, r.stderr)
                    for sign in CRASH_SIGNS:
                        self.assertNotIn(sign, r.stderr)

    def test_a_script_that_catches_the_fault_still_exits_1(self):
        if not cuda_present(TFHOST):
            self.skipTest("no GPU is present: the faults need one")
        path = self.script("caught.lua", "\n".join([
            'local mod = tf.cuda.compile([[extern "C" __global__ void bad(float *x) { x[(long long)1 << 36] = 1; }]])',
            "local x = tf.zeros(4, {device = 'cuda'})",
            "mod:kernel('bad'):launch({grid = 1, block = 1}, x)",
            "print(pcall(tf.sync))",
            "print('after')",
        ]) + "\n")
        r = self.run_tfhost(path)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("after", r.stdout)
        self.assertIn("the CUDA context is now unusable", r.stderr)
        self.assertIn(f"bad, launched at {path}:3", r.stderr)


    def test_compute_sanitizer_names_the_scripts_line(self):
        if not cuda_present(TFHOST):
            self.skipTest("no GPU is present: compute-sanitizer needs one")
        sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        if not os.path.exists(sanitizer):
            self.skipTest("compute-sanitizer is not installed (CUDA Toolkit, on PATH or in /usr/local/cuda/bin)")
        path = self.script("oob.lua", "\n".join([
            "local mod = tf.cuda.compile([[",
            'extern "C" __global__ void oob(float *x, int n) {',
            "  int i = blockIdx.x * blockDim.x + threadIdx.x;",
            "  x[i + n] = 1.0f;",
            "}]])",
            "local x = tf.zeros(32, {device = 'cuda'})",
            "mod:kernel('oob'):launch({grid = 1, block = 32}, x, 1 << 20)",
            "tf.sync()",
        ]) + "\n")
        r = subprocess.run([sanitizer, "--tool", "memcheck", "--print-limit", "1", TFHOST, path], capture_output=True,
                           text=True, timeout=300, cwd=self.dir, env=self.env)
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertIn("Invalid __global__ write of size 4 bytes", out)
        self.assertIn("in oob.lua:4", out)  # the kernel's line in the script, through lineinfo
        self.assertNotIn("on CUDA API call", out, "tfhost's own calls must not show up as API errors")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_kernels.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
