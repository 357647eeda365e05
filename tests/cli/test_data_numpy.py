#!/usr/bin/env python3
"""tf.data.tokens against NumPy, and the byte dataset command: token files written with np.memmap
(as nanoGPT and the CS336 course write them), np.save and np.lib.format.open_memmap read back in
tfhost as the same tokens; experiments/make_bytes_dataset.lua on a small folder of text files gives
train.bin and val.bin whose uint16 tokens are the files' bytes, joined by newlines in sorted order,
split at the last --val_fraction, with meta.json's counts and hashes.

    python3 tests/cli/test_data_numpy.py /path/to/tfhost

Without numpy it prints SKIP and exits 77.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from need_numpy import np  # noqa: E402  (skips without numpy)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None
TIMEOUT = 120

# Prints, for the file and options given, the token count, dtype, every sequential window of the
# file (as one flat list of inputs and the last target) and a random batch with its offsets, as JSON.
READ_SCRIPT = """\
local path, dtype = arg[1], arg[2]
local ds <close> = tf.data.tokens(path, { dtype = dtype ~= "" and dtype or nil, seed = 3 })
local flat = {}
for x, y in ds:windows(4, 5) do
  local xs, ys = x:tolist(), y:tolist()
  for r = 1, #xs do
    for t = 1, 5 do flat[#flat + 1] = xs[r][t] end
    last = ys[r][5]
  end
end
local probe = tf.data.tokens(path, { dtype = dtype ~= "" and dtype or nil, seed = 3 })
local starts = probe:offsets(6, 7)
local x, y = ds:batch(6, 7)
print(tf.json.encode({ n = #ds, dtype = ds.dtype, flat = flat, last = last, starts = starts, x = x:tolist(),
  y = y:tolist() }))
"""


def run(*args, cwd=None):
    return subprocess.run([TFHOST, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)


class NumpyFiles(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.script = os.path.join(self.tmp.name, "read.lua")
        with open(self.script, "w") as f:
            f.write(READ_SCRIPT)

    def tearDown(self):
        self.tmp.cleanup()

    def read(self, path, dtype=""):
        r = run(self.script, path, dtype)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def check_same(self, tokens, path, dtype, want_dtype):
        got = self.read(path, dtype)
        self.assertEqual(got["n"], len(tokens))
        self.assertEqual(got["dtype"], want_dtype)
        count = (len(tokens) - 1) // 5
        self.assertEqual(got["flat"], [int(v) for v in tokens[:count * 5]])
        self.assertEqual(got["last"], int(tokens[count * 5]))
        for r, s in enumerate(got["starts"]):
            self.assertTrue(0 <= s <= len(tokens) - 7 - 1)
            self.assertEqual(got["x"][r], [int(v) for v in tokens[s:s + 7]])
            self.assertEqual(got["y"][r], [int(v) for v in tokens[s + 1:s + 8]])

    def test_memmap_raw_files(self):
        rng = np.random.default_rng(0)
        for dtype, name, high in ((np.uint16, "u16", 65536), (np.uint32, "u32", 2 ** 32)):
            tokens = rng.integers(0, high, size=1003, dtype=np.int64).astype(dtype)
            path = os.path.join(self.tmp.name, f"tokens_{name}.bin")
            mm = np.memmap(path, dtype=dtype, mode="w+", shape=(len(tokens),))
            mm[:] = tokens
            mm.flush()
            del mm
            with self.subTest(dtype=name):
                self.check_same(tokens, path, "" if name == "u16" else name, name)

    def test_npy_files(self):
        rng = np.random.default_rng(1)
        cases = (("<u2", "u16"), ("<u4", "u32"), ("<i4", "i32"), ("<i8", "i64"), ("|u1", "u8"), ("<i2", "i16"))
        for descr, name in cases:
            tokens = rng.integers(0, 200, size=517).astype(np.dtype(descr))
            path = os.path.join(self.tmp.name, f"tokens_{name}.npy")
            np.save(path, tokens)
            with self.subTest(dtype=descr):
                self.check_same(tokens, path, "", name)
        # written through open_memmap, as large arrays are (format 1.0 or 2.0 by the header's size)
        tokens = rng.integers(0, 50000, size=2000).astype(np.uint16)
        path = os.path.join(self.tmp.name, "open_memmap.npy")
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(2000,))
        mm[:] = tokens
        mm.flush()
        del mm
        self.check_same(tokens, path, "", "u16")
        # a version 2.0 header
        path = os.path.join(self.tmp.name, "v2.npy")
        with open(path, "wb") as f:
            np.lib.format.write_array(f, tokens, version=(2, 0))
        self.check_same(tokens, path, "", "u16")

    def test_refusals_name_the_file(self):
        path = os.path.join(self.tmp.name, "matrix.npy")
        np.save(path, np.zeros((3, 4), dtype=np.uint16))
        r = run(self.script, path, "")
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{path}: the array has 2 dimensions", r.stderr)
        path = os.path.join(self.tmp.name, "floats.npy")
        np.save(path, np.zeros(10, dtype=np.float32))
        r = run(self.script, path, "")
        self.assertIn("dtype '<f4' is not a token dtype", r.stderr)
        path = os.path.join(self.tmp.name, "big_endian.npy")
        np.save(path, np.zeros(10, dtype=">u2"))
        self.assertIn("big-endian", run(self.script, path, "").stderr)


class ByteDataset(unittest.TestCase):
    def test_text_files_become_byte_tokens_split_train_and_val(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "texts")
            os.makedirs(os.path.join(src, "sub"))
            contents = {"b.txt": "second file\n", "a.txt": "first: caf\u00e9 \u2713\n",
                        "sub/c.txt": "third, in a folder " * 50, "skip.bin": "not read"}
            for name, text in contents.items():
                with open(os.path.join(src, name), "w", encoding="utf-8") as f:
                    f.write(text)
            with open(os.path.join(src, "bytes.txt"), "wb") as f:
                f.write(bytes(range(256)))  # every byte value survives
            r = run(os.path.join(ROOT, "experiments", "make_bytes_dataset.lua"), "--from", src, "--ext", "txt",
                    "--out", "out/bytes", "--val_fraction", "0.25", "--json", "r.json", cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stderr, r"\[1/\d+\] ")
            names = sorted([n for n in contents if n.endswith(".txt")] + ["bytes.txt"])
            blobs = []
            for n in names:
                with open(os.path.join(src, n), "rb") as f:
                    blobs.append(f.read())
            joined = b"\n".join(blobs)
            train = np.fromfile(os.path.join(tmp, "out/bytes/train.bin"), dtype="<u2")
            val = np.fromfile(os.path.join(tmp, "out/bytes/val.bin"), dtype="<u2")
            n_val = int(len(joined) * 0.25)
            self.assertEqual(len(val), n_val)
            self.assertEqual(len(train), len(joined) - n_val)
            self.assertEqual(bytes(np.concatenate([train, val]).astype(np.uint8)), joined)
            self.assertLess(int(max(train.max(), val.max())), 256)
            with open(os.path.join(tmp, "out/bytes/meta.json")) as f:
                meta = json.load(f)
            self.assertEqual(meta["vocab_size"], 256)
            self.assertEqual((meta["train_tokens"], meta["val_tokens"], meta["files"]),
                             (len(train), n_val, len(names)))
            listing = "\n".join(f"{n}\t{len(b)}" for n, b in zip(names, blobs))
            self.assertEqual(meta["sources_sha256"], hashlib.sha256(listing.encode()).hexdigest())
            with open(os.path.join(tmp, "out/bytes/train.bin"), "rb") as f:
                self.assertEqual(meta["train_sha256"], hashlib.sha256(f.read()).hexdigest())
            with open(os.path.join(tmp, "r.json")) as f:
                doc = json.load(f)
            self.assertIs(doc["complete"], True)
            self.assertEqual(sum(row["tokens"] for row in doc["results"]), len(joined))
            self.assertFalse([n for n in os.listdir(os.path.join(tmp, "out/bytes")) if n.endswith(".partial")])
            # tf.data.tokens reads it back
            check = run("-e", f"local ds = tf.data.tokens('{tmp}/out/bytes/val.bin', {{ vocab_size = 256 }}); "
                        "io.write(#ds, ' ', tostring(ds:check()))")
            self.assertEqual(check.stdout, f"{n_val} true", check.stderr)

    def test_no_files_and_missing_folders_are_usage_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(ROOT, "experiments", "make_bytes_dataset.lua")
            r = run(script, "--from", os.path.join(tmp, "missing"), cwd=tmp)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("missing: No such file or directory", r.stderr)
            r = run(script, "--from", tmp, "--ext", "xyz", cwd=tmp)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("no files ending in xyz", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_data_numpy.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
