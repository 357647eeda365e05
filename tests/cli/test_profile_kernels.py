"""experiments/profile_kernels.lua from the outside, at the tiny size (seconds on a CPU): the text
under its tables says what its own numbers say (busy share of the wall time, kernels that ran at
the same time, softmax's share of the time against its share of the FLOPs), busy time is never
more than the wall time or the summed kernel time, and a table left empty says why.

    python3 tests/cli/test_profile_kernels.py /path/to/tfhost
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None
SMALL = ["--size", "tiny", "--context", "32", "--batch", "2", "--warmup", "1", "--passes", "3"]


def run(*args):
    return subprocess.run([TFHOST, "experiments/profile_kernels.lua", *SMALL, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def run_json(test, *args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        r = run(*args, "--json", out)
        test.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return r.stdout, json.load(f)["results"]


def section(text, letter):
    """The text of section (letter), up to the next section."""
    start = text.index(f"## ({letter})")
    nxt = text.find("\n## (", start + 1)
    return text[start:nxt if nxt >= 0 else len(text)]


def table(text):
    """The first Markdown table of text as a list of dicts by column title."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def config(row):
    return f"{row['size']} ctx {row['context']} {row['impl']}"


def line_with(text, start):
    found = [line for line in text.splitlines() if line.startswith(start)]
    return found[0] if found else None


class ProfileKernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text, cls.rows = run_json(cls(), "--impl", "eager,fused")

    def test_busy_time_within_wall_and_kernel_time(self):
        self.assertEqual([config(r) for r in self.rows], ["tiny ctx 32 eager", "tiny ctx 32 fused"])
        for r in self.rows:
            for part in ("fwd", "step"):
                busy, kernel, wall = r[f"{part}_busy_ms"], r[f"{part}_kernel_ms"], r[f"{part}_host_ms"]
                self.assertGreater(busy, 0, (part, r))
                self.assertLessEqual(busy, kernel * (1 + 1e-9), (part, r))
                self.assertLessEqual(busy, wall + 0.1, (part, r))  # ms: a GPU clock mapping's error

    def test_section_a_text_follows_the_numbers(self):
        a = section(self.text, "a")
        shown = {f"{x['size']} ctx {x['ctx']} {x['impl']}": x for x in table(a)}
        pcts = {"fwd": [], "step": []}
        for r in self.rows:
            cells = shown[config(r)]
            for part in ("fwd", "step"):
                pct = 100 * r[f"{part}_busy_ms"] / r[f"{part}_host_ms"]
                self.assertEqual(cells[f"{part} busy %"], f"{pct:.1f}", (part, r))
                self.assertEqual(cells[f"{part} busy ms"], f"{r[part + '_busy_ms']:.3f}")
                pcts[part].append(pct)
        spread = {}
        for part, values in pcts.items():
            lo, hi = f"{min(values):.1f} %", f"{max(values):.1f} %"
            spread[part] = lo if lo == hi else f"{lo} to {hi}"
        sentence = re.search(r"was busy (.+) of the forward pass's wall time and (.+) of the training step's", a)
        self.assertTrue(sentence, a)
        self.assertEqual(sentence.groups(), (spread["fwd"], spread["step"]))
        overlapped = [(part, config(r)) for r in self.rows for part in ("fwd", "step")
                      if r[f"{part}_kernel_ms"] > r[f"{part}_busy_ms"] * 1.001]
        if overlapped:
            line = line_with(a, "Kernels ran at the same time")
            self.assertTrue(line, a)
            for part, name in overlapped:
                self.assertIn(("the forward pass of " if part == "fwd" else "the training step of ") + name, line)
        else:
            self.assertIn("No kernels ran at the same time", a)

    def test_section_e_words_follow_the_ratios(self):
        e = section(self.text, "e")
        self.assertNotIn("far larger share", self.text)
        larger = line_with(e, "Softmax takes a larger share") or ""
        smaller = line_with(e, "Softmax takes a smaller share") or ""
        within = line_with(e, "Softmax's share of the time is that of its FLOPs") or ""
        rows = [r for r in self.rows if "time_ratio" in r]
        self.assertEqual(len(rows), 2, "naive attention on both implementations")
        self.assertEqual(len(table(e)), 2)
        for r in rows:
            name = config(r) + " ("
            lo, hi, flops = r["min_time_ratio"], r["max_time_ratio"], r["flop_ratio"]
            self.assertLessEqual(lo, r["time_ratio"] * (1 + 1e-12))
            self.assertGreaterEqual(hi, r["time_ratio"] * (1 - 1e-12))
            where = [name in larger, name in smaller, name in within]
            self.assertEqual(where, [lo > flops, hi < flops, lo <= flops <= hi], (r, e))

    def test_empty_tables_say_why(self):
        # no non-GEMM kernel can have all of the forward pass: (c) is empty, and says so
        text, rows = run_json(self, "--impl", "fused", "--min_pct", "100")
        c = section(text, "c")
        self.assertIn("## (c) Non-GEMM kernels with at least 100% of the forward pass", c)
        self.assertEqual(table(c), [])
        note = line_with(c, "The table is empty: no non-GEMM kernel has 100% of the forward pass in any "
                            "configuration: tiny ctx 32 fused (the largest, ")
        self.assertTrue(note, c)
        self.assertLess(float(re.search(r"has ([0-9.]+) %\)", note).group(1)), 100)
        self.assertFalse(rows[0]["non_gemm"])  # an empty list (JSON {} from an empty Lua table)
        # FlashAttention has no softmax of its own: (e) is empty, and says so
        text, rows = run_json(self, "--impl", "fused", "--attention", "flash")
        e = section(text, "e")
        self.assertEqual(table(e), [])
        self.assertIn("Not in the table: tiny ctx 32 fused (FlashAttention: softmax and the matmuls are one kernel).",
                      e)
        self.assertIn("The table is empty", e)
        # out of memory everywhere: OOM in the rows, and every section says there is nothing to show
        text, rows = run_json(self, "--memory_limit", "0.0001")
        self.assertTrue(all(r.get("oom") for r in rows), rows)
        a = section(text, "a")
        self.assertTrue(all(x["fwd busy ms"] == "OOM" for x in table(a)), a)
        self.assertIn("Every configuration ran out of memory", a)
        self.assertIn("The table is empty: every configuration ran out of memory.", section(text, "c"))
        self.assertIn("(out of memory)", section(text, "e"))

    def test_roofline(self):
        """--roofline: on a GPU, the tables of a counted training step of each implementation and the four
        pictures; on the CPU, a line that says the roofline needs a GPU's hardware counters, and exit 0."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "roof")
            r = run("--impl", "fused", "--passes", "1", "--roofline", "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            part = r.stdout[r.stdout.index("## Roofline: one training step under the hardware counters"):]
            if not cuda_present(TFHOST):
                self.assertIn("The roofline needs a GPU's hardware counters (tf.prof.start{metrics = \"roofline\"}), "
                              "and the device is the CPU: this part is skipped.", part)
                self.assertFalse(os.path.exists(out), "nothing written")
                return
            for impl in ("fused", "eager"):
                self.assertIn(f"tiny ctx 32 {impl}, one training step", part)
                for ext in ("svg", "html"):
                    path = os.path.join(out, f"roofline_{impl}.{ext}")
                    self.assertIn("wrote " + path, part)
                    with open(path) as f:
                        self.assertIn('<circle class="kernel"', f.read(), path)
            self.assertIn("| name | class | % time | TFLOP/s | GB/s | FLOP/byte | of roof | bound |", part)

    def test_bad_min_pct(self):
        r = run("--min_pct", "101")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--min_pct must be in [0, 100]", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_profile_kernels.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
