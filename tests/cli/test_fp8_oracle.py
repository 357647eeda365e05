#!/usr/bin/env python3
"""tfhost's 8-bit float casts against PyTorch's own (tests/reference/oracles/fp8.json, written by
tests/reference/torch_fp8.py where torch is): the codes of every float32 input of the oracle, plain
and saturating, and of every float16 and bfloat16 bit pattern, in both formats, bit for bit; every
code decoded to float32 bit for bit (NaN payloads included), to float16 and bfloat16 bit for bit for
numbers (NaN as NaN: their payloads follow tfhost's f32 rules). On a GPU, the device's casts too.
Where the script also wrote tests/reference/oracles/fp8_torch.safetensors (safetensors.torch's file
of float8 tensors), tfhost loads it and saves it again with the same dtypes, shapes and bytes.
Without the oracle file it prints SKIP (saying how to make it) and exits 77.

    python3 tests/cli/test_fp8_oracle.py build-cuda/tfhost
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "reference", "oracles", "fp8.json")
TORCH_FILE = os.path.join(HERE, "..", "reference", "oracles", "fp8_torch.safetensors")
sys.path.insert(0, HERE)
if not os.path.exists(ORACLE):
    print(f"SKIP: no PyTorch oracle at {os.path.relpath(ORACLE)} (run python3 tests/reference/torch_fp8.py "
          "where torch is)")
    sys.exit(77)
from need_numpy import np  # noqa: E402  (skips without numpy)
import fp8_formats as F  # noqa: E402
from cuda_present import cuda_present  # noqa: E402

TFHOST = None


def arr(hexstr, dtype):
    return np.frombuffer(bytes.fromhex(hexstr), dtype)


class Fp8Oracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(ORACLE) as f:
            cls.oracle = json.load(f)
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-fp8-oracle-")
        x32 = arr(cls.oracle["f32_inputs"], "<u4")
        pat = np.arange(65536, dtype=np.uint32).astype("<u2").tobytes()
        entries = [("x32", "F32", [len(x32)], x32.tobytes()), ("x16", "F16", [65536], pat),
                   ("xb16", "BF16", [65536], pat)] + F.code_entries()
        cls.inputs = os.path.join(cls.scratch.name, "in.safetensors")
        F.write_raw(cls.inputs, entries)
        cls.script = os.path.join(cls.scratch.name, "casts.lua")
        cls.x32 = x32

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def compare(self, out, ref, where):
        sources = {"from_f32": "x32", "from_f16": "x16", "from_bf16": "xb16"}
        for section, src in sources.items():
            for key, hexcodes in ref[section].items():
                fmt, sat = key.split("_")[0], key.endswith("_sat")
                want = arr(hexcodes, np.uint8)
                got = np.frombuffer(out[f"{src}.{fmt}" + (".sat" if sat else "")][2], np.uint8)
                bad = np.nonzero(got != want)[0]
                msg = ""
                if len(bad):
                    i = bad[0]
                    inp = f"0x{self.x32[i]:08x}" if src == "x32" else f"0x{i:04x}"
                    msg = (f"{where} {section} {key}: {len(bad)} codes differ from torch's; first: input {inp} "
                           f"gave 0x{got[i]:02x}, torch 0x{want[i]:02x}")
                self.assertEqual(len(bad), 0, msg)
        for fmt, lists in ref["decode"].items():
            want = arr(lists["f32"], "<u4")
            got = np.frombuffer(out[f"c.{fmt}.f32"][2], "<u4")
            bad = [c for c in range(256) if got[c] != want[c]]
            self.assertEqual(bad, [], f"{where} {fmt} to f32 differs from torch at codes "
                             + ", ".join(f"0x{c:02x} (0x{got[c]:08x} vs 0x{want[c]:08x})" for c in bad[:8]))
            for d, mask in (("f16", (0x7C00, 0x03FF)), ("bf16", (0x7F80, 0x007F))):
                want = arr(lists[d], "<u2")
                got = np.frombuffer(out[f"c.{fmt}.{d}"][2], "<u2")
                for c in range(256):
                    nan = (want[c] & mask[0]) == mask[0] and (want[c] & mask[1]) != 0
                    if nan:
                        self.assertTrue((got[c] & mask[0]) == mask[0] and (got[c] & mask[1]) != 0,
                                        f"{where} {fmt} 0x{c:02x} to {d}: 0x{got[c]:04x}, torch NaN 0x{want[c]:04x}")
                    else:
                        self.assertEqual(got[c], want[c], f"{where} {fmt} 0x{c:02x} to {d}")

    def test_cpu_matches_torch(self):
        out = F.run_casts(TFHOST, self.script, self.inputs, os.path.join(self.scratch.name, "cpu.safetensors"), "cpu")
        self.compare(out, self.oracle["cpu"], "cpu")

    def test_reads_the_file_torch_wrote(self):
        if not os.path.exists(TORCH_FILE):
            self.skipTest(f"no {os.path.relpath(TORCH_FILE)} (torch_fp8.py writes it where safetensors is installed)")
        script = os.path.join(self.scratch.name, "resave.lua")
        with open(script, "w") as f:
            f.write("tf.safetensors.save(arg[2], tf.safetensors.load(arg[1], { device = 'cpu' }))\n")
        again = os.path.join(self.scratch.name, "again.safetensors")
        r = subprocess.run([TFHOST, script, TORCH_FILE, again], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(F.read_safetensors(again), F.read_safetensors(TORCH_FILE))

    def test_gpu_matches_torch(self):
        if not cuda_present(TFHOST):
            self.skipTest("no GPU is present")
        out = F.run_casts(TFHOST, self.script, self.inputs, os.path.join(self.scratch.name, "gpu.safetensors"),
                          "cuda")
        self.compare(out, self.oracle["cpu"], "gpu")
        if "cuda" in self.oracle:
            # torch's GPU casts differ from its CPU's only for NaN inputs (whose sign they drop: the f16
            # 0xfc01 gives 0x7f there, 0xff on its CPU); tfhost's GPU gives its CPU's bits, which are
            # torch's CPU's (above): its casts are twins, and torch's GPU agrees everywhere else
            cpu, gpu = self.oracle["cpu"], self.oracle["cuda"]
            nan = {"from_f32": lambda i: (self.x32[i] & 0x7F800000) == 0x7F800000 and (self.x32[i] & 0x7FFFFF) != 0,
                   "from_f16": lambda i: (i & 0x7C00) == 0x7C00 and (i & 0x3FF) != 0,
                   "from_bf16": lambda i: (i & 0x7F80) == 0x7F80 and (i & 0x7F) != 0}
            differ = 0
            for section, is_nan in nan.items():
                for key, codes in gpu[section].items():
                    bad = np.nonzero(arr(cpu[section][key], np.uint8) != arr(codes, np.uint8))[0]
                    differ += len(bad)
                    self.assertEqual([int(i) for i in bad if not is_nan(int(i))], [],
                                     f"torch's GPU and CPU {section} {key} differ for inputs that are not NaN")
            print(f"torch's GPU casts differ from its CPU's in {differ} codes, all of NaN inputs", file=sys.stderr)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "build-cuda/tfhost"
    unittest.main()
