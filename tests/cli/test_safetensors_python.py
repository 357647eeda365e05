#!/usr/bin/env python3
"""tf.safetensors against the reference implementation: files written by the
Python `safetensors` package load in tfhost with the same values, files
written by tfhost load in Python with the same values, and where both sides
order tensors the same way they write the same bytes.

Run by ctest as `python3 tests/cli/test_safetensors_python.py /path/to/tfhost`
from the repository root. Needs numpy and safetensors (scripts/install-deps.sh
installs them when it can); without them it prints SKIP and exits 77. BF16,
which numpy lacks, is written and read by hand-built headers here.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"SKIP: the Python packages numpy and safetensors are needed ({e}); "
          "install them with: pip install --user numpy safetensors")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_bytes import read_raw, write_raw  # noqa: E402

TFHOST = None  # the binary under test, from sys.argv[1]
RUN_TIMEOUT = 60

# Loads each file given and writes, per file, {name: {dtype, shape, values}}
# and the metadata as JSON; values are flattened, NaN and infinities as strings.
DUMP_SCRIPT = """\
local function dump(t)
  local shape = {}
  for i = 1, t.ndim do shape[i] = t.shape[i] end
  local values = t:numel() > 0 and t:reshape({ -1 }):tolist() or {}
  return { dtype = t.dtype, shape = tf.json.array(shape), values = tf.json.array(values) }
end
local out = {}
for i = 2, #arg do
  local tensors, meta = tf.safetensors.load(arg[i], { device = "cpu" })
  local d = {}
  for name, t in pairs(tensors) do d[name] = dump(t) end
  out[arg[i]] = { tensors = d, metadata = meta }
end
tf.json.write(arg[1], out, { nan = "string" })
"""

# Loads arg[1] and saves its tensors and metadata to arg[2].
RESAVE_SCRIPT = """\
local tensors, meta = tf.safetensors.load(arg[1], { device = "cpu" })
tf.safetensors.save(arg[2], tensors, meta)
"""

NP_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
             "bool": np.bool_}


def reference_arrays():
    """Every dtype numpy and tfhost share, with edge values and edge shapes."""
    f32 = np.array([1.5, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.4e38, -7.25], np.float32)
    return {
        "f32": f32.reshape(2, 4),
        "f16": np.array([1.5, -2, 65504, 6e-8, np.inf, np.nan, -0.0], np.float16),
        "f64": np.array([0.1, 1 / 3, 5e-324, -1e308, np.nan], np.float64),
        "i64": np.array([-2**63, -1, 0, 2**63 - 1, 2**53 + 1], np.int64),
        "i32": np.array([[-2**31, -1], [0, 2**31 - 1]], np.int32),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, np.float64),
        "empty": np.zeros((2, 0, 3), np.float32),
        "eight": np.arange(256, dtype=np.float32).reshape((2,) * 8),
        "w.weight": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    }


def bf16_bits(values):
    """bf16 bit patterns of float32 values that bf16 holds exactly."""
    bits = np.array(values, np.float32).view(np.uint32)
    assert not np.any(bits & 0xFFFF), "values must be exact in bf16"
    return (bits >> 16).astype(np.uint16)


def same_bits(test, got, want, what):
    """Equal shapes, dtypes and bits; any NaN matches any NaN."""
    test.assertEqual(got.dtype, want.dtype, what)
    test.assertEqual(got.shape, want.shape, what)
    if want.dtype.kind == "f":
        nan = np.isnan(want)
        test.assertTrue(np.array_equal(np.isnan(got), nan), f"{what}: NaNs differ: {got} vs {want}")
        uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        test.assertTrue(np.array_equal(got[~nan].view(uint), want[~nan].view(uint)), f"{what}: {got} vs {want}")
    else:
        test.assertTrue(np.array_equal(got, want), f"{what}: {got} vs {want}")


def from_dump(entry):
    """The numpy array a tfhost JSON dump describes."""
    def number(v):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, v) if isinstance(v, str) else v
    dtype = NP_DTYPES[entry["dtype"]]
    values = [number(v) for v in entry["values"]]
    if dtype in (np.int64, np.int32, np.bool_):
        arr = np.array(values, dtype)
    else:
        arr = np.array(values, np.float64).astype(dtype)
    return arr.reshape(entry["shape"])


class SafetensorsInterop(unittest.TestCase):
    def setUp(self):
        scratch = tempfile.TemporaryDirectory(prefix="tfhost-safetensors-")
        self.addCleanup(scratch.cleanup)
        self.dir = scratch.name

    def path(self, name):
        return os.path.join(self.dir, name)

    def tfhost(self, script, *args):
        script_path = self.path("script.lua")
        with open(script_path, "w") as f:
            f.write(textwrap.dedent(script))
        r = subprocess.run([TFHOST, script_path, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                           cwd=self.dir)
        self.assertGreaterEqual(r.returncode, 0, f"tfhost died by a signal: {r.stderr}")
        self.assertNotIn("PANIC", r.stderr)
        return r

    def tfhost_ok(self, script, *args):
        r = self.tfhost(script, *args)
        self.assertEqual(r.returncode, 0, f"tfhost failed:\n{r.stdout}\n{r.stderr}")
        return r

    def dump(self, *paths):
        out = self.path("dump.json")
        self.tfhost_ok(DUMP_SCRIPT, out, *paths)
        with open(out) as f:
            return json.load(f)

    def test_python_file_loads_in_tfhost(self):
        arrays = reference_arrays()
        src = self.path("python.safetensors")
        save_file(arrays, src, metadata={"format": "np", "note": "é ✓"})
        d = self.dump(src)[src]
        self.assertEqual(d["metadata"], {"format": "np", "note": "é ✓"})
        self.assertEqual(sorted(d["tensors"]), sorted(arrays))
        for name, want in arrays.items():
            same_bits(self, from_dump(d["tensors"][name]), want, name)

    def test_tfhost_file_loads_in_python(self):
        arrays = reference_arrays()
        src, out = self.path("python.safetensors"), self.path("tfhost.safetensors")
        save_file(arrays, src, metadata={"format": "np"})
        self.tfhost_ok(RESAVE_SCRIPT, src, out)
        back = load_file(out)
        self.assertEqual(sorted(back), sorted(arrays))
        for name, want in arrays.items():
            same_bits(self, back[name], want, name)
        with safe_open(out, "np") as f:
            self.assertEqual(f.metadata(), {"format": "np"})
        header, _ = read_raw(out)
        names = [k for k in header if k != "__metadata__"]
        self.assertEqual(names, sorted(names), "tfhost writes tensors in sorted name order")
        self.assertEqual(os.listdir(self.dir).count("tfhost.safetensors"), 1)
        self.assertFalse([n for n in os.listdir(self.dir) if ".tmp" in n], "no temporary file is left behind")

    def test_values_made_in_tfhost(self):
        out = self.path("made.safetensors")
        self.tfhost_ok("""\
            local cpu = { device = "cpu" }
            tf.safetensors.save(arg[1], {
              ramp = tf.arange(0, 3, 0.5, cpu),
              ids = tf.arange(5, cpu),
              grid = tf.arange(6, { device = "cpu", dtype = "i32" }):reshape({ 2, 3 }):t(),
              half = tf.full({ 2, 2 }, -0.375, { device = "cpu", dtype = "f16" }),
              flags = tf.tensor({ true, false }, cpu),
            }, { step = 7, tag = "run" })
            """, out)
        back = load_file(out)
        same_bits(self, back["ramp"], np.arange(0, 3, 0.5, dtype=np.float32), "ramp")
        same_bits(self, back["ids"], np.arange(5, dtype=np.int64), "ids")
        same_bits(self, back["grid"], np.arange(6, dtype=np.int32).reshape(2, 3).T.copy(), "grid")
        same_bits(self, back["half"], np.full((2, 2), -0.375, np.float16), "half")
        same_bits(self, back["flags"], np.array([True, False]), "flags")
        with safe_open(out, "np") as f:
            self.assertEqual(f.metadata(), {"step": "7", "tag": "run"})

    def test_bf16_both_ways(self):
        values = [1.0, -2.5, 0.0078125, 2.0**127, -0.0, 65536.0]
        src, out = self.path("bf16.safetensors"), self.path("bf16_out.safetensors")
        write_raw(src, [("x", "BF16", (2, 3), bf16_bits(values).tobytes()),
                        ("y", "F32", (2,), np.array([1, 2], np.float32).tobytes())], metadata={"k": "v"})
        d = self.dump(src)[src]
        self.assertEqual(d["tensors"]["x"]["dtype"], "bf16")
        self.assertEqual(d["tensors"]["x"]["shape"], [2, 3])
        self.assertEqual(d["tensors"]["x"]["values"], values)
        self.tfhost_ok(RESAVE_SCRIPT, src, out)
        header, data = read_raw(out)
        x = header["x"]
        self.assertEqual((x["dtype"], x["shape"]), ("BF16", [2, 3]))
        raw = np.frombuffer(data[x["data_offsets"][0]:x["data_offsets"][1]], np.uint16)
        self.assertEqual((raw.astype(np.uint32) << 16).view(np.float32).tolist(), values)
        with safe_open(out, "np") as f:  # the reference reader accepts the file
            self.assertEqual(sorted(f.keys()), ["x", "y"])
            self.assertEqual(f.metadata(), {"k": "v"})
            same_bits(self, f.get_tensor("y"), np.array([1, 2], np.float32), "y")

    def test_same_bytes_as_python(self):
        # The Python library orders tensors by alignment, then name; with one
        # dtype (or dtypes already in that order) both write identical files.
        for i, (arrays, meta) in enumerate([
            ({"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.zeros(0, np.float32),
              "s": np.array(2.5, np.float32)}, {"format": "np"}),
            ({"a": np.ones(2), "b": np.arange(3, dtype=np.int32), "c": np.array([True, False])}, None),
        ]):
            src, out = self.path(f"py{i}.safetensors"), self.path(f"tf{i}.safetensors")
            save_file(arrays, src, metadata=meta)
            self.tfhost_ok(RESAVE_SCRIPT, src, out)
            with open(src, "rb") as f1, open(out, "rb") as f2:
                self.assertEqual(f2.read(), f1.read(), f"case {i}")

    def test_damaged_python_file_is_refused(self):
        src = self.path("python.safetensors")
        save_file({"w": np.ones((4, 4), np.float32)}, src)
        with open(src, "rb") as f:
            blob = f.read()
        bad = self.path("truncated.safetensors")
        with open(bad, "wb") as f:
            f.write(blob[:-3])
        r = self.tfhost('tf.safetensors.load(arg[1])', bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"tf.safetensors.load: {bad}: tensor 'w': data_offsets [0, 64] go past the end of the data "
                      "(61 bytes; truncated file?)", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_safetensors_python.py /path/to/tfhost")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
