#!/usr/bin/env python3
"""tfhost's 8-bit floats against the formats' definitions (tests/cli/fp8_formats.py, an independent
model of PyTorch's casts): every one of the 256 codes of each format decodes to its value (to f32,
f16, bf16 and f64), and the casts into both formats, plain and saturating, of every float16 value,
every bfloat16 value, every grid point, tie and the float32 values either side, the ranges' edges,
NaNs, infinities, zeros and 200000 random float32 patterns, and of doubles near the ties, give the
model's codes. The inputs travel in a safetensors file written by hand here, the results come back
in one tfhost writes (F8_E4M3 / F8_E5M2 tensors, read by hand), so the file format is checked too;
where Python's safetensors package is installed it must read tfhost's F8 header as well. On a GPU
the same casts run on the device and must give the CPU's bytes.

    python3 tests/cli/test_fp8.py build-cuda/tfhost
"""
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from need_numpy import np  # noqa: E402  (skips without numpy)
import fp8_formats as F  # noqa: E402
from cuda_present import cuda_present  # noqa: E402

TFHOST = None


def decoded(raw, dtype):
    """Python floats of a tfhost output tensor's bytes."""
    if dtype == "F32":
        return np.frombuffer(raw, np.float32).astype(np.float64)
    if dtype == "F64":
        return np.frombuffer(raw, np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float64)
    if dtype == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError(dtype)


class Fp8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-fp8-")
        d = cls.scratch.name
        cls.x32 = F.f32_inputs()
        cls.x16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        cls.xb16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        cls.x64 = F.f64_inputs()
        entries = [
            ("x32", "F32", [len(cls.x32)], cls.x32.tobytes()),
            ("x16", "F16", [65536], cls.x16.tobytes()),
            ("xb16", "BF16", [65536], cls.xb16.tobytes()),
            ("x64", "F64", [len(cls.x64)], cls.x64.tobytes()),
        ] + F.code_entries()
        cls.inputs = os.path.join(d, "in.safetensors")
        F.write_raw(cls.inputs, entries)
        cls.script = os.path.join(d, "casts.lua")
        cls.out = F.run_casts(TFHOST, cls.script, cls.inputs, os.path.join(d, "out.safetensors"), "cpu")
        # the float32 value (as a Python float) of every input, by source
        cls.values = {
            "x32": F.f32(cls.x32).astype(np.float64),
            "x16": cls.x16.view(np.float16).astype(np.float64),
            "xb16": (cls.xb16.astype(np.uint32) << 16).view(np.float32).astype(np.float64),
            "x64": cls.x64.astype(np.float32).astype(np.float64),  # f64 goes through f32
        }

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def check_codes(self, name, fmt, saturate):
        key = f"{name}.{fmt}" + (".sat" if saturate else "")
        dtype, shape, raw = self.out[key]
        self.assertEqual(dtype, F.FORMATS[fmt][4], key)
        got = np.frombuffer(raw, np.uint8)
        src = self.values[name]
        want = np.array([F.encode(fmt, float(v), saturate) for v in src], np.uint8)
        bad = np.nonzero(got != want)[0]
        if len(bad):
            i = bad[0]
            self.fail(f"{key}: {len(bad)} of {len(src)} codes differ; first: input {src[i]!r} gave "
                      f"0x{got[i]:02x}, want 0x{want[i]:02x}")

    def test_casts_into_both_formats(self):
        for name in self.values:
            for fmt in F.FORMATS:
                for saturate in (False, True):
                    with self.subTest(source=name, fmt=fmt, saturate=saturate):
                        self.check_codes(name, fmt, saturate)

    def test_every_code_decodes_to_its_value(self):
        for fmt in F.FORMATS:
            want_f32 = np.array([F.decoded_f32_bits(fmt, c) for c in range(256)], np.uint32)
            dtype, _, raw = self.out[f"c.{fmt}.f32"]
            self.assertEqual(dtype, "F32")
            got = np.frombuffer(raw, np.uint32)
            for c in range(256):
                self.assertEqual(got[c], want_f32[c], f"{fmt} code 0x{c:02x}: f32 bits 0x{got[c]:08x}, "
                                 f"want 0x{want_f32[c]:08x} ({F.value(fmt, c)})")
            for d in ("F16", "BF16", "F64"):
                key = f"c.{fmt}.{d.lower()}"
                dt, _, raw = self.out[key]
                self.assertEqual(dt, d, key)
                got = decoded(raw, d)
                for c in range(256):
                    v = F.value(fmt, c)
                    if math.isnan(v):
                        self.assertTrue(math.isnan(got[c]), f"{key} code 0x{c:02x}: {got[c]}, want NaN")
                        self.assertEqual(math.copysign(1, got[c]), -1 if c & 0x80 else 1, f"{key} 0x{c:02x} sign")
                    else:
                        self.assertEqual(got[c], v, f"{key} code 0x{c:02x}")
                        self.assertEqual(math.copysign(1, got[c]), math.copysign(1, v), f"{key} 0x{c:02x} sign")

    def test_codes_round_trip_through_a_file(self):
        for fmt in F.FORMATS:
            dtype, shape, raw = self.out[f"c.{fmt}"]
            self.assertEqual((dtype, shape, raw), (F.FORMATS[fmt][4], [256], bytes(range(256))))

    def test_model_spot_values(self):
        # the model itself, against values worked out by hand
        self.assertEqual(F.value("f8e4m3", 0x7E), 448.0)
        self.assertEqual(F.value("f8e4m3", 0x01), 2.0**-9)
        self.assertEqual(F.value("f8e4m3", 0x08), 2.0**-6)
        self.assertEqual(F.value("f8e5m2", 0x7B), 57344.0)
        self.assertEqual(F.value("f8e5m2", 0x7C), math.inf)
        self.assertEqual(F.value("f8e5m2", 0x01), 2.0**-16)
        self.assertEqual(F.encode("f8e4m3", 464.0), 0x7E)
        self.assertEqual(F.encode("f8e4m3", 464.00003), 0x7F)
        self.assertEqual(F.encode("f8e4m3", math.inf), 0x7F)
        self.assertEqual(F.encode("f8e4m3", -math.inf, saturate=True), 0xFE)
        self.assertEqual(F.encode("f8e5m2", 61440.0), 0x7C)
        self.assertEqual(F.encode("f8e5m2", 61439.996), 0x7B)
        self.assertEqual(F.encode("f8e5m2", 2.0**-17), 0x00)
        self.assertEqual(F.encode("f8e5m2", -0.0), 0x80)
        self.assertEqual(F.encode("f8e4m3", 0.3), 0x2A)

    def test_python_safetensors_reads_the_header(self):
        try:
            from safetensors import safe_open
        except ImportError:
            self.skipTest("the Python package safetensors is not installed")
        path = os.path.join(self.scratch.name, "out.safetensors")
        with safe_open(path, framework="numpy") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in ("c.f8e4m3", "c.f8e5m2")}
        self.assertEqual(dtypes, {"c.f8e4m3": "F8_E4M3", "c.f8e5m2": "F8_E5M2"})

    def test_gpu_casts_match_the_cpu(self):
        if not cuda_present(TFHOST):
            self.skipTest("no GPU is present")
        gpu = F.run_casts(TFHOST, self.script, self.inputs, os.path.join(self.scratch.name, "gpu.safetensors"),
                          "cuda")
        self.assertEqual(sorted(gpu), sorted(self.out))
        for key in self.out:
            self.assertEqual(gpu[key], self.out[key], f"{key}: the GPU's bytes differ from the CPU's")


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "build-cuda/tfhost"
    unittest.main()
