#!/usr/bin/env python3
"""`tfhost compare` and the provenance of results files:
  - rows matched by configuration, every metric side by side with its ratio
    to the first file, rows of one file only marked, out-of-memory cells;
  - the environments' differences above the table, a warning when the scripts
    differ; Markdown, --json and --csv outputs;
  - --threshold: exit 1 when a time rises or a throughput falls by more than
    the threshold (memory does not count), or a row runs out of memory;
  - bad input: a missing, malformed or foreign file, an unknown metric, or no
    rows in common: exit 2 with a message naming the file and what is missing;
  - a real run of experiments/benchmark.lua against a file written the way
    tests/reference/torch_benchmark.py writes (its row functions, on made-up
    timings): the same column names, so the rows match;
  - the run's provenance: script path and SHA-256, binary SHA-256, command
    line, start and duration.

Run by ctest as `python3 tests/cli/test_compare.py /path/to/tfhost`. Standard library only."""
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import results_file  # noqa: E402

TFHOST = None

# Writes the rows of a JSON file as a results file, declaring key and metrics.
WRITER = r"""
local rows = tf.json.read(arg[1])
for _, r in ipairs(rows) do if r.fwd_ms == tf.json.null then r.fwd_ms, r.oom = "OOM", true end end
tf.results.write(arg[2], rows, {key = {"impl", "seq"}, metrics = {"fwd_ms", "tflops"}})
"""


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def made_up(seqs, slower=None, oom=None, peak_scale=1.0):
    """Rows of a sweep: fwd_ms = seq / 100 (naive twice that); slower = (impl, seq, factor)."""
    rows = []
    for impl in ("naive", "flash"):
        for seq in seqs:
            ms = seq / 100 * (2 if impl == "naive" else 1)
            if slower and slower[:2] == (impl, seq):
                ms *= slower[2]
            row = dict(impl=impl, seq=seq, fwd_ms=ms, tflops=seq / ms, peak_gib=seq / 1000 * peak_scale)
            if oom == (impl, seq):
                row["fwd_ms"] = None
                del row["tflops"]
            rows.append(row)
    return rows


class Compare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-compare-")
        cls.dir = cls.scratch.name
        cls.writer = cls.script("writer.lua", WRITER)
        cls.a = cls.results("a.json", made_up([64, 128, 256, 512]), threads=1)
        cls.b = cls.results("b.json", made_up([128, 256, 512, 1024], slower=("flash", 512, 1.25), peak_scale=1.5),
                            threads=2)
        cls.c = cls.results("c.json", made_up([128, 256, 512], oom=("naive", 512)), threads=1)

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    @classmethod
    def script(cls, name, text):
        path = os.path.join(cls.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    @classmethod
    def results(cls, name, rows, threads=1, writer=None):
        rows_path = os.path.join(cls.dir, name + ".rows")
        with open(rows_path, "w") as f:
            json.dump(rows, f)
        out = os.path.join(cls.dir, name)
        r = subprocess.run([TFHOST, "--threads", str(threads), writer or cls.writer, rows_path, out],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"tfhost failed:\n{r.stdout}\n{r.stderr}")
        return out

    def compare(self, *args):
        return subprocess.run([TFHOST, "compare", *args], capture_output=True, text=True, timeout=120, cwd=self.dir)

    def test_markdown(self):
        r = self.compare(self.a, self.b)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn(f"- A: {self.a} (", out)
        self.assertIn(f"- B: {self.b} (", out)
        self.assertIn("| host.threads | 1 | 2 |", out, "the environments' differences")
        self.assertLess(out.index("host.threads"), out.index("| impl | seq |"), "above the table")
        self.assertIn("| impl | seq | fwd_ms A | fwd_ms B | B/A | tflops A | tflops B | B/A | rows |", out)
        self.assertIn("| flash | 512 | 5.12 | 6.4 | 1.25 | 100 | 80 | 0.80 |  |", out)
        self.assertIn("| flash | 256 | 2.56 | 2.56 | 1.00 | 100 | 100 | 1.00 |  |", out)
        self.assertIn("| naive | 64 | 1.28 |  |  | 50 |  |  | A only |", out)
        self.assertIn("| naive | 1024 |  | 20.48 |  |  | 50 |  | B only |", out)
        self.assertIn("(6 rows in common, 4 in some files only)", out)
        self.assertNotIn("warning", out + r.stderr, "the same script wrote both")

    def test_json_output(self):
        r = self.compare(self.a, self.b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["key"], ["impl", "seq"])
        self.assertEqual(doc["metrics"], ["fwd_ms", "tflops"])
        self.assertEqual([f["label"] for f in doc["files"]], ["A", "B"])
        self.assertEqual(doc["common_rows"], 6)
        diffs = {d["setting"]: d["values"] for d in doc["differences"]}
        self.assertEqual(diffs["host.threads"], {"A": 1, "B": 2})
        with open(self.a) as f:
            a = {(x["impl"], x["seq"]): x for x in json.load(f)["results"]}
        with open(self.b) as f:
            b = {(x["impl"], x["seq"]): x for x in json.load(f)["results"]}
        self.assertEqual(len(doc["rows"]), len(set(a) | set(b)))
        for row in doc["rows"]:
            k = (row["config"]["impl"], row["config"]["seq"])
            self.assertEqual(row["present"], [lab for lab, side in (("A", a), ("B", b)) if k in side])
            for m in ("fwd_ms", "tflops"):
                if k in a and k in b:
                    self.assertAlmostEqual(row["ratios"][m]["B"], b[k][m] / a[k][m], places=12)
                    self.assertEqual(row["values"][m], {"A": a[k][m], "B": b[k][m]})
                else:
                    self.assertEqual(row["ratios"][m], {})

    def test_csv_output(self):
        r = self.compare(self.a, self.b, "--csv")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = list(csv.DictReader(io.StringIO(r.stdout)))
        self.assertEqual(list(rows[0]), ["impl", "seq", "fwd_ms A", "fwd_ms B", "fwd_ms B/A", "tflops A", "tflops B",
                                         "tflops B/A", "rows"], "every column named once")
        self.assertEqual(len(rows), 10)
        flash512 = next(x for x in rows if x["impl"] == "flash" and x["seq"] == "512")
        self.assertEqual((flash512["fwd_ms A"], flash512["fwd_ms B"], flash512["fwd_ms B/A"]), ("5.12", "6.4", "1.25"))
        self.assertEqual(flash512["tflops B/A"], "0.80")

    def test_threshold(self):
        r = self.compare(self.a, self.b, "--threshold", "10")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("### Regressions beyond 10%", r.stdout)
        self.assertIn("- B impl=flash seq=512 fwd_ms: +25.0% (5.12 -> 6.4)", r.stdout)
        self.assertIn("- B impl=flash seq=512 tflops: -20.0% (100 -> 80)", r.stdout)
        r = self.compare(self.a, self.b, "--threshold", "30")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("No time rose and no throughput fell by more than 30%.", r.stdout)
        # memory grew by half: shown, not a regression
        r = self.compare(self.a, self.b, "--threshold", "30", "--metric", "fwd_ms,peak_gib")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("| 0.512 | 0.768 | 1.50 |", r.stdout)
        # a configuration that ran before and runs out of memory now
        r = self.compare(self.a, self.c, "--threshold", "30")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("- B impl=naive seq=512 fwd_ms: ran out of memory", r.stdout)
        self.assertIn("| naive | 512 | 10.24 | OOM |  |", r.stdout)
        doc = json.loads(self.compare(self.a, self.c, "--threshold", "30", "--json").stdout)
        self.assertEqual([(g["config"], g["metric"]) for g in doc["regressions"]], [("impl=naive seq=512", "fwd_ms"),
                                                                                   ("impl=naive seq=512", "tflops")])

    def test_three_files(self):
        r = self.compare(self.a, self.b, self.c, "--metric", "fwd_ms")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| impl | seq | fwd_ms A | fwd_ms B | B/A | fwd_ms C | C/A | rows |", r.stdout)
        self.assertIn("| naive | 64 | 1.28 |  |  |  |  | A only |", r.stdout)
        self.assertIn("| flash | 1024 |  | 10.24 |  |  |  | B only |", r.stdout)

    def test_bad_input(self):
        missing = os.path.join(self.dir, "missing.json")
        r = self.compare(self.a, missing)
        self.assertEqual(r.returncode, 2)
        self.assertIn(missing, r.stderr)
        self.assertIn("No such file", r.stderr)
        cases = {
            "broken.json": ('{"results": [', "not JSON"),
            "foreign.json": ('{"name": "x", "version": 3}', 'not a results file: no "results" field (it has name, version)'),
            "list.json": ("[1, 2, 3]", "not a results file: the top level is a list"),
            "badrow.json": ('{"results": [{"seq": 1}, "x"]}', "not a results file: results[2] is a string, not a row"),
            "empty.json": ('{"results": []}', '"results" has no rows'),
        }
        for name, (text, why) in cases.items():
            path = self.script(name, text)
            r = self.compare(self.a, path)
            self.assertEqual(r.returncode, 2, name)
            self.assertIn(f"tfhost compare: {path}: {why}", r.stderr)
            self.assertNotIn("traceback", r.stderr.lower(), name)
        r = self.compare(self.a)
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs two or more results files", r.stderr)
        r = self.compare(self.a, self.b, "--metric", "nope_ms")
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{self.a}: no column 'nope_ms'", r.stderr)
        r = self.compare(self.a, self.b, "--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option '--bogus'", r.stderr)

    def test_no_common_rows(self):
        other = self.results("other.json", made_up([2048, 4096]))
        r = self.compare(self.a, other)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("tfhost compare: the files have no rows in common (matched by impl, seq)", r.stderr)

    def test_scripts_differ(self):
        other_writer = self.script("other_writer.lua", "-- another script\n" + WRITER)
        other = self.results("d.json", made_up([128, 256]), writer=other_writer)
        r = self.compare(self.a, other)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: the scripts differ: A ran " + self.writer, r.stderr)
        self.assertIn(f"B ran {other_writer} (sha256 {sha256(other_writer)[:12]})", r.stderr)
        self.assertIn("**warning**: the scripts differ", r.stdout)

    def test_named_parts(self):
        """Results that are named parts (as experiments/mixed_precision.lua writes) compare part by part."""
        writer = self.script("parts.lua", r"""
local rows = tf.json.read(arg[1])
local half = {}
for _, r in ipairs(rows) do half[#half + 1] = {impl = r.impl, seq = r.seq, fwd_ms = r.fwd_ms / 2} end
tf.results.write(arg[2], {timing = rows, halved = half, notes = {{text = "no numbers here"}}})
""")
        p1 = self.results("p1.json", made_up([128, 256]), writer=writer)
        p2 = self.results("p2.json", made_up([128, 256], slower=("naive", 256, 2.0)), writer=writer)
        r = self.compare(p1, p2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("### Part halved (4 rows in common", r.stdout)
        self.assertIn("### Part timing (4 rows in common", r.stdout)
        self.assertIn("| naive | 256 | 2.56 | 5.12 | 2.00 |", r.stdout, "halved: 5.12 / 2 and 10.24 / 2")
        self.assertIn("Not compared: notes: the files have no numeric column in common", r.stdout)
        doc = json.loads(self.compare(p1, p2, "--json", "--threshold", "40").stdout)
        self.assertEqual(sorted(doc["parts"]), ["halved", "timing"])
        self.assertEqual(len(doc["parts"]["timing"]["regressions"]), 2, "fwd_ms up and tflops down")
        self.assertEqual(self.compare(p1, p2, "--threshold", "40").returncode, 1)
        self.assertEqual(self.compare(p1, p2, "--threshold", "150").returncode, 0)
        r = self.compare(p1, p2, "--part", "halved", "--csv")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(list(csv.DictReader(io.StringIO(r.stdout)))), 4)
        r = self.compare(p1, p2, "--csv")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--csv needs --part NAME", r.stderr)
        r = self.compare(p1, p2, "--part", "nope")
        self.assertEqual(r.returncode, 2)
        self.assertIn(f'{p1}: "results" has no part "nope" (it has halved, notes, timing)', r.stderr)
        r = self.compare(p1, self.a)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no part of their results in common", r.stderr)

    def test_repeated_configurations_warn(self):
        rows = made_up([128, 256])
        twice = self.results("twice.json", rows + rows)
        r = self.compare(self.a, twice)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"warning: {twice}: 4 rows repeat the configuration of an earlier row (key: impl, seq)", r.stderr)

    def test_plot(self):
        svg = os.path.join(self.dir, "cmp.svg")
        r = self.compare(self.a, self.b, "--plot", svg)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(svg) as f:
            text = f.read()
        self.assertEqual(text.count('class="tf-plot"'), 2, "a chart per metric: fwd_ms, tflops")
        self.assertIn(">sequence length (tokens), log scale</text>", text, "x: the numeric key column")
        self.assertEqual(set(re.findall(r'data-label="([^"]*)" data-group="([^"]*)"', text)),
                         {(i, g) for i in ("naive", "flash") for g in ("A: a.json", "B: b.json")})
        r = self.compare(self.a, self.b, "--plot", svg, "--x", "impl", "--metric", "fwd_ms")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(svg) as f:
            text = f.read()
        self.assertIn(">implementation</text>", text, "--x chooses the column")
        # an --x that names no configuration column is refused with the accepted ones, and nothing is drawn
        for x, why in (("nope", "--x nope: no row has a column 'nope' (accepted: impl, seq, file)"),
                       ("fwd_ms", "--x fwd_ms: 'fwd_ms' is not a column that names a configuration (accepted: impl, seq, file")):
            bad = os.path.join(self.dir, "bad_x.svg")
            r = self.compare(self.a, self.b, "--plot", bad, "--x", x)
            self.assertEqual(r.returncode, 2, x)
            self.assertIn("tfhost compare: " + why, r.stderr)
            self.assertFalse(os.path.exists(bad), "no chart is written for a bad --x")
        # a column with one value in every row is a setting, not an axis
        flash_a = self.results("flash_a.json", [r for r in made_up([64, 128]) if r["impl"] == "flash"])
        flash_b = self.results("flash_b.json", [r for r in made_up([64, 128]) if r["impl"] == "flash"])
        r = self.compare(flash_a, flash_b, "--plot", svg, "--x", "impl")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--x impl: 'impl' is flash in every row, so it cannot be the x axis (accepted: seq, file)", r.stderr)
        r = self.compare(self.a, self.b, "--x", "seq")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--x seq: --x chooses the x axis of --plot's charts: give --plot FILE too", r.stderr)
        r = self.compare(self.a, self.b, "--plot", os.path.join(self.dir, "cmp.png"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("--plot: " + os.path.join(self.dir, "cmp.png") + ": the name must end in .svg or .html", r.stderr)

    def test_plot_of_one_configuration(self):
        # one row a file (a single benchmark configuration beside PyTorch's): no key column is left to
        # draw along, so the files themselves are the x axis (this was exit 2, and no table either)
        one_a = self.results("one_a.json", [dict(impl="flash", seq=512, fwd_ms=2.0, tflops=256.0)])
        one_b = self.results("one_b.json", [dict(impl="flash", seq=512, fwd_ms=2.5, tflops=204.8)])
        svg = os.path.join(self.dir, "one.svg")
        r = self.compare(one_a, one_b, "--plot", svg)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| 2 | 2.5 | 1.25 | 256 | 204.8 | 0.80 |", r.stdout)
        with open(svg) as f:
            text = f.read()
        self.assertEqual(text.count('class="tf-plot"'), 2, "a chart per metric: fwd_ms, tflops")
        self.assertIn(">file</text>", text, "x: the files")
        for label in ("A: one_a.json", "B: one_b.json"):
            self.assertIn(f">{label}</text>", text, "a category per file")

    def test_help(self):
        r = self.compare("--help")
        self.assertEqual(r.returncode, 0)
        self.assertTrue(r.stdout.startswith("usage: tfhost compare [options] A.json B.json [C.json ...]"), r.stdout)
        for option in ("--metric", "--key", "--threshold", "--json", "--csv", "--plot"):
            self.assertIn(option, r.stdout)

    def test_benchmark_against_a_torch_file_and_provenance(self):
        tf_json = os.path.join(self.dir, "tf_bench.json")
        script = os.path.join(ROOT, "experiments", "benchmark.lua")
        cmd = [TFHOST, "--threads", "1", script, "--size", "tiny", "--context", "32", "--precision", "f32",
               "--steps", "1", "--warmup", "1", "--json", tf_json]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(tf_json) as f:
            doc = json.load(f)
        env = doc["env"]
        self.assertEqual(env["script"], script)
        self.assertEqual(env["script_sha256"], sha256(script))
        self.assertEqual(env["tfhost"]["binary_sha256"], sha256(TFHOST))
        self.assertEqual(env["command"], cmd)
        self.assertRegex(env["started"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertGreater(env["duration_s"], 0)
        self.assertEqual(env["seed"], 0)
        self.assertIn("version", env["tfhost"])
        self.assertIn("build", env["tfhost"])
        self.assertEqual(doc["key"], results_file.BENCHMARK_KEY)
        self.assertEqual(doc["metrics"], results_file.BENCHMARK_METRICS)

        # PyTorch's file, written by torch_benchmark.py's own row functions on made-up timings
        torch_rows = [results_file.benchmark_row("tiny", 32, "f32", mode, "eager", 1, 4, [t, t * 1.1], 1e9, 2 ** 27,
                                                 1234)
                      for mode, t in (("fwd", 2.0), ("fwdbwd", 6.0), ("step", 8.0))]
        torch_rows += results_file.benchmark_oom_rows("tiny", 64, "f32", ["fwd"], "eager", 1, 4)
        torch_json = os.path.join(self.dir, "torch_bench.json")
        results_file.write(torch_json, torch_rows, results_file.BENCHMARK_KEY, results_file.BENCHMARK_METRICS,
                           results_file.env(device="NVIDIA H100 (made up)", torch="2.x"))
        ours = doc["results"]
        for t in torch_rows[:3]:
            self.assertLessEqual(set(t), set(ours[0]), "PyTorch's rows use tfhost's column names")
        r = self.compare(tf_json, torch_json, "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cmp = json.loads(r.stdout)
        self.assertEqual(cmp["common_rows"], 3)
        self.assertEqual(cmp["key"], ["context", "mode"], "impl (fused vs eager) is a setting of each file")
        diffs = {d["setting"]: d["values"] for d in cmp["differences"]}
        self.assertEqual(diffs["rows: impl"], {"A": ours[0]["impl"], "B": "eager"})
        # the device tfhost ran on: the CPU here, cuda:0 (its name) on a GPU machine
        self.assertEqual(diffs["device"], {"A": env["device"], "B": "NVIDIA H100 (made up)"})
        self.assertRegex(env["device"], r"^(cpu|cuda:\d+ \(.+\))$")
        by_mode = {row["config"]["mode"]: row for row in cmp["rows"] if row["config"]["context"] == 32}
        for t in torch_rows[:3]:
            mine = next(o for o in ours if o["mode"] == t["mode"])
            self.assertAlmostEqual(by_mode[t["mode"]]["ratios"]["mean_ms"]["B"], t["mean_ms"] / mine["mean_ms"],
                                   places=9)
        oom = next(row for row in cmp["rows"] if row["config"]["context"] == 64)
        self.assertEqual(oom["present"], ["B"])
        self.assertEqual(oom["values"]["mean_ms"], {"B": "OOM"})


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_compare.py /path/to/tfhost")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
