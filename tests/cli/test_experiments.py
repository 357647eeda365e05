"""What every experiment of experiments/ promises a first user, from the outside:
  - a sweep stopped by SIGINT (Ctrl-C) or SIGKILL leaves a valid results file with the rows that
    finished, marked "complete": false, and the finished file says "complete": true;
  - bad option values are refused up front with exit code 2, before any progress line;
  - --help shows the default on a GPU and on a CPU; kernel_bandwidth's says it needs a GPU;
  - texts that interpret a result are computed from it: overhead.lua's verdicts, fused_vs_eager.lua's
    "within noise" and "n/a (no graphs)";
  - the out-of-memory cross of a chart stands clear of every point;
  - README lists every option `tfhost --help` has.
(test_experiment_defaults.py runs each experiment at its CPU defaults.)

    python3 tests/cli/test_experiments.py /path/to/tfhost
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None


def run(script, *args, timeout=300):
    return subprocess.run([TFHOST, "--device", "cpu", "experiments/" + script, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def rows_written(path):
    """The results file's document once it exists and parses, else None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Interrupted(unittest.TestCase):
    def interrupt(self, sig, script, *args):
        """Starts script, waits for two rows in its results file, sends sig; returns the file's document."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            p = subprocess.Popen([TFHOST, "--device", "cpu", "experiments/" + script, *args, "--json", out], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 120
            doc = None
            while time.time() < deadline and p.poll() is None:
                doc = rows_written(out)
                if doc and len(doc["results"]) >= 2:
                    break
                time.sleep(0.05)
            self.assertIsNone(p.poll(), "the sweep ended before it could be interrupted")
            p.send_signal(sig)
            stdout, stderr = p.communicate(timeout=60)
            self.assertNotEqual(p.returncode, 0, stderr)
            doc = rows_written(out)
            self.assertIsNotNone(doc, "a valid results file is left")
            self.assertEqual([f for f in os.listdir(tmp) if f != "r.json" and not f.endswith(".part")], [])
            return doc, stderr

    def test_ctrl_c_keeps_the_rows_done(self):
        seqs = ",".join(str(32 + 8 * i) for i in range(40))
        doc, stderr = self.interrupt(signal.SIGINT, "attention_sweep.lua", "--d", "16", "--seq", seqs, "--batch", "1",
                                     "--iters", "20", "--warmup", "0")
        self.assertIs(doc["complete"], False)
        self.assertEqual(doc["progress"]["total"], 80)
        self.assertGreaterEqual(doc["progress"]["done"], 2)
        self.assertEqual(len(doc["results"]), doc["progress"]["done"])
        for row in doc["results"]:
            self.assertGreater(row["fwd_ms"], 0)
        self.assertEqual(doc["key"], ["dtype", "d", "seq", "impl", "batch", "causal"])
        self.assertIn("device", doc["env"])
        self.assertRegex(stderr, r"\[2/80\] f32 d 16 seq 32 flash \.\.\. done \([\d.]+ s; about .* left\)")

    def test_kill_keeps_the_rows_done(self):
        doc, _ = self.interrupt(signal.SIGKILL, "benchmark.lua", "--size", "tiny", "--context",
                                ",".join(str(8 + i) for i in range(30)), "--batch", "1", "--steps", "2", "--warmup",
                                "0", "--mode", "fwd", "--precision", "f32")
        self.assertIs(doc["complete"], False)
        self.assertGreaterEqual(len(doc["results"]), 2)
        self.assertEqual([r["context"] for r in doc["results"]], list(range(8, 8 + len(doc["results"]))))

    def test_a_finished_sweep_says_complete(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            r = run("memory_profile.lua", "--context", "16", "--precision", "f32", "--mode", "forward", "--out", "",
                    "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                doc = json.load(f)
            self.assertEqual(os.listdir(tmp), ["r.json"])
        self.assertIs(doc["complete"], True)
        self.assertEqual(doc["progress"], {"done": 1, "total": 1})
        self.assertIn("1 of 1 done in ", r.stderr)


class Options(unittest.TestCase):
    REFUSED = [
        ("benchmark.lua", ["--size", "tiny", "--context", "0"], "option '--context' values must be >= 1 (got 0)"),
        ("memory_profile.lua", ["--context", "-32"], "option '--context' values must be >= 1 (got -32)"),
        ("overhead.lua", ["--rounds", "2"], "option '--rounds' must be >= 3 (got 2)"),
        ("fused_vs_eager.lua", ["--iters", "0"], "option '--iters' must be >= 1 (got 0)"),
        ("attention_sweep.lua", ["--memory_limit", "-1"], "option '--memory_limit' must be >= 0 (got -1.0)"),
        ("flash_benchmark.lua", ["--heads", "0"], "option '--heads' must be >= 1 (got 0)"),
        ("mixed_precision.lua", ["--steps", "0"], "option '--steps' must be >= 1 (got 0)"),
        ("hello.lua", ["--size", "0"], "option '--size' must be >= 1 (got 0)"),
        ("ddp.lua", ["--context", "0"], "option '--context' must be >= 1 (got 0)"),
        ("ddp.lua", ["--size", "huge"], "unknown size 'huge'"),
        ("allreduce.lua", ["--sizes", "4,0"], "option '--sizes' values must be >= 1 (got 0)"),
        ("kernel_bandwidth.lua", ["--steps", "0"], "option '--steps' must be >= 1 (got 0)"),
    ]

    def test_bad_values_are_refused_up_front(self):
        for script, args, message in self.REFUSED:
            with self.subTest(script=script, args=args):
                r = run(script, *args, timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertNotIn("[1/", r.stderr, "refused before the sweep starts")
                self.assertEqual(r.stdout, "")

    def test_help_shows_the_gpu_and_the_cpu_default(self):
        r = run("attention_sweep.lua", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--seq INTS          sequence lengths (default: 256,1024,4096,8192,16384 on a GPU, 64,128,256 "
                      "on a CPU)", r.stdout)
        self.assertIn("--iters INT         timed passes of each kind (default: 100 on a GPU, 5 on a CPU)", r.stdout)
        r = run("ddp.lua", "--help")
        self.assertRegex(r.stdout, r"--size STR +model preset .*\(default: xl on a GPU, tiny on a CPU\)")
        self.assertRegex(r.stdout, r"--context INT +sequence length \(default: 512 on a GPU, 64 on a CPU\)")
        r = run("overhead.lua", "--help")
        self.assertIn("(default: small,2.7B on a GPU, tiny on a CPU)", r.stdout)
        r = run("kernel_bandwidth.lua", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("Needs a CUDA device", r.stdout)

    def test_readme_lists_every_tfhost_option(self):
        usage = subprocess.run([TFHOST, "--help"], capture_output=True, text=True, timeout=60).stdout
        options = sorted(set(re.findall(r"^\s+(--[a-z][a-z-]*|-[a-zA-Z])\b", usage, re.M)))
        self.assertIn("--threads", options)
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        listing = readme.split("## Running scripts", 1)[1].split("```", 2)[1]
        for option in options:
            self.assertRegex(listing, r"\n\s+" + re.escape(option) + r"\b", f"README's option list lacks {option}")


class ComputedTexts(unittest.TestCase):
    def test_overhead_verdicts_follow_the_numbers(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "o.json")
            r = run("overhead.lua", "--size", "tiny", "--steps", "2", "--rounds", "3", "--context", "16", "--batch",
                    "1", "--precision", "f32", "--impl", "fused", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                rows = json.load(f)["results"]
        header = next(line for line in r.stdout.splitlines() if line.startswith("| size |"))
        self.assertNotIn("|  |", header, "every column has a title")
        self.assertIn("| verdict |", header)
        self.assertIn("spread = half the range of the rounds", r.stdout)  # 3 rounds: the range, not quartiles
        table = {line.split(" | ")[2]: line for line in r.stdout.splitlines() if line.startswith("| tiny |")}
        for row in rows:
            line = table[row["mode"]]
            if row["mode"] == "plain":
                self.assertIn("the reference", line)
                continue
            pct, noise = row["overhead_pct"], row["noise_pct"]
            self.assertGreaterEqual(noise, row["spread_pct"] - 1e-9)
            if abs(pct) <= noise:
                self.assertIn("within noise (±%.1f %%)" % noise, line)
            elif pct < 0:
                self.assertIn("noise: below plain by more than its spread", line)
            else:
                self.assertIn("costs %.1f %% (noise ±%.1f %%)" % (pct, noise), line)

    def test_fused_vs_eager_marks_noise_and_graphs_na_on_the_cpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "f.json")
            r = run("fused_vs_eager.lua", "--quick", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                doc = json.load(f)
        model = doc["results"]["model"][0]
        self.assertIs(model["graphs"], False)
        self.assertNotIn("fwd_graphs_speedup", model)
        line = next(x for x in r.stdout.splitlines() if x.startswith("| tiny |"))
        self.assertEqual(line.count("n/a (no graphs)"), 2)
        self.assertIn("replays no CUDA graphs", r.stdout)

        def noisy(row, slow, fast, what):
            a, b = row[f"{slow}_{what}_ms"], row[f"{fast}_{what}_ms"]
            spread = row[f"{slow}_{what}_std_ms"] / a + row[f"{fast}_{what}_std_ms"] / b
            return abs(a / b - 1) <= spread, spread
        cells = [c.strip() for c in line.split("|")[1:-1]]
        for index, what in ((5, "fwd"), (10, "step")):
            inside, spread = noisy(model, "eager", "fused", what)
            self.assertEqual("within noise" in cells[index], inside, (cells[index], model))
            if inside:
                self.assertIn("(within noise (±%.0f %%))" % (100 * spread), cells[index])
        for row in doc["results"]["attention"]:
            line = next(x for x in r.stdout.splitlines() if x.startswith("| %d | %d |" % (row["d"], row["seq"])))
            cells = [c.strip() for c in line.split("|")[1:-1]]
            self.assertEqual("within noise" in cells[4], noisy(row, "naive", "flash", "fwd")[0], cells)
            self.assertEqual("within noise" in cells[7], noisy(row, "naive", "flash", "fwdbwd")[0], cells)


class OutOfMemoryCross(unittest.TestCase):
    def test_the_cross_stands_clear_of_the_points(self):
        with tempfile.TemporaryDirectory() as tmp:
            svg_path = os.path.join(tmp, "oom.svg")
            r = run("attention_sweep.lua", "--batch", "2", "--d", "16", "--seq", "32,64,128,512", "--iters", "1",
                    "--warmup", "0", "--memory_limit", "0.004", "--plot", svg_path)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(svg_path) as f:
                svg = f.read()
        crosses = [(float(x), float(y)) for x, y in re.findall(r'<g class="oom" data-x="([\d.]+)" data-y="([\d.]+)"',
                                                               svg)]
        points = [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)]
        self.assertTrue(crosses, "naive attention ran out of memory at seq 512")
        top = min(y for _, y in points)
        for cx, cy in crosses:
            for px, py in points:
                if abs(px - cx) < 10:
                    self.assertGreater(py - 3.5, cy + 6, f"the cross at ({cx}, {cy}) covers the point ({px}, {py})")
        self.assertTrue(any(abs(px - crosses[0][0]) < 10 for px, _ in points), "flash's point is at that x too")
        self.assertGreater(top, 0)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
