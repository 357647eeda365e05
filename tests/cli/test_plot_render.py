#!/usr/bin/env python3
"""tf.plot's pictures, as a browser draws them: headless Chromium renders
  (a) a chart of made-up sweep rows (three series, one running out of
      memory): each series' colour must appear inside the plot area and in
      the legend, the rising series must rise on screen, the OOM cross must
      be drawn where the SVG says;
  (b) an HTML page of two charts: both drawn, no script in it;
  (c) the page an experiment writes with --plot (attention_sweep.lua on the
      CPU) and the chart `tfhost compare --plot` draws: the series' colours
      are on the picture;
  (d) every other sweep experiment's --plot page (benchmark.lua, with rows
      that ran out of memory; flash_benchmark.lua, memory_profile.lua,
      profile_kernels.lua): its charts, axis, series and OOM marks.
The PNG screenshots are decoded here (tests/cli/chromium.py) and their pixels
checked. Chromium is needed: without it these tests fail and say so, unless
TF_ALLOW_NO_CHROMIUM=1 (then they are skipped).

Run by ctest as `python3 tests/cli/test_plot_render.py /path/to/tfhost`."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chromium import find_chromium, screenshot  # noqa: E402

TFHOST = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Three series over doubling sizes; "naive" runs out of memory at the last one.
CHART_SCRIPT = r"""
local dir = arg[1]
local rows = {}
for _, impl in ipairs({"naive", "flash", "flash2"}) do
  for i, seq in ipairs({256, 512, 1024, 2048, 4096}) do
    local r = {impl = impl, seq = seq}
    if impl == "naive" and seq == 4096 then r.oom, r.fwd_ms = true, "OOM"
    else r.fwd_ms = (impl == "flash2" and 40 / i or seq * (impl == "naive" and 0.02 or 0.01)) end
    rows[#rows + 1] = r
  end
end
tf.plot.write(dir .. "/chart.svg", {rows = rows, x = "seq", y = "fwd_ms", series = {"impl"}, title = "Forward",
  logy = false})
tf.plot.write(dir .. "/page.html", {{rows = rows, x = "seq", y = "fwd_ms", series = {"impl"}},
  {rows = rows, x = "seq", y = "fwd_ms", series = {"impl"}, logy = true}}, {title = "Two charts"})
io.write(table.concat(tf.plot.palette, " "))
"""


def hexrgb(text):
    return tuple(int(text[i:i + 2], 16) for i in (1, 3, 5))


def pixels_of(picture, colour, box, tol=14):
    """(x, y) of the pixels within tol of colour (each channel) inside box = (x0, y0, x1, y1)."""
    width, height, channels, rows = picture
    x0, y0, x1, y1 = (max(0, int(box[0])), max(0, int(box[1])), min(width, int(box[2])), min(height, int(box[3])))
    out = []
    for y in range(y0, y1):
        row = rows[y]
        for x in range(x0, x1):
            px = row[x * channels:x * channels + 3]
            if all(abs(a - b) <= tol for a, b in zip(px, colour)):
                out.append((x, y))
    return out


class Rendered(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-plot-")
        cls.dir = cls.scratch.name
        script = os.path.join(cls.dir, "chart.lua")
        with open(script, "w") as f:
            f.write(CHART_SCRIPT)
        r = subprocess.run([TFHOST, script, cls.dir], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"tfhost failed:\n{r.stdout}\n{r.stderr}")
        cls.palette = [hexrgb(c) for c in r.stdout.split()]

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def render(self, name, width, height):
        if find_chromium() is None and os.environ.get("TF_ALLOW_NO_CHROMIUM") == "1":
            self.skipTest("chromium is not installed")
        try:
            return screenshot("file://" + os.path.join(self.dir, name), os.path.join(self.dir, name + ".png"), width,
                              height, self.dir)
        except RuntimeError as e:
            self.fail(f"{e}; set TF_ALLOW_NO_CHROMIUM=1 to skip this test")

    def test_chart_pixels(self):
        with open(os.path.join(self.dir, "chart.svg")) as f:
            svg = f.read()
        self.assertNotIn("<script", svg)
        w, h = (int(v) for v in re.search(r'<svg [^>]*width="(\d+)" height="(\d+)"', svg).groups())
        area = [int(v) for v in re.search(r'class="plot-area" x="(\d+)" y="(\d+)" width="(\d+)" height="(\d+)"',
                                          svg).groups()]
        box = (area[0] + 2, area[1] + 2, area[0] + area[2] - 2, area[1] + area[3] - 2)
        legend = (area[0] + area[2] + 4, area[1], w, area[1] + 120)
        picture = self.render("chart.svg", w, h)
        self.assertEqual(picture[:2], (w, h))
        naive, flash, flash2 = self.palette[:3]
        for name, colour in (("naive", naive), ("flash", flash), ("flash2", flash2)):
            inside = pixels_of(picture, colour, box)
            self.assertGreater(len(inside), 60, f"{name}'s line and points are drawn in the plot area")
            self.assertGreater(len(pixels_of(picture, colour, legend)), 15, f"{name} has its swatch in the legend")

        def mean_y(colour, x0, x1):
            ys = [y for x, y in pixels_of(picture, colour, (x0, box[1], x1, box[3]))]
            self.assertTrue(ys, "pixels of the series in that band")
            return sum(ys) / len(ys)
        quarter = (box[2] - box[0]) / 4
        left_band, right_band = (box[0], box[0] + quarter), (box[2] - quarter, box[2])
        # flash rises (time grows with seq): higher on screen (smaller y) to the right; flash2 falls
        self.assertGreater(mean_y(flash, *left_band), mean_y(flash, *right_band) + 50)
        self.assertLess(mean_y(flash2, *left_band), mean_y(flash2, *right_band) - 50)
        # the OOM cross, in naive's colour where the SVG puts it, at the top of the last x
        cx, cy = (float(v) for v in re.search(r'<g class="oom" data-x="([\d.]+)" data-y="([\d.]+)"', svg).groups())
        cross = pixels_of(picture, naive, (cx - 8, cy - 8, cx + 9, cy + 9))
        self.assertGreater(len(cross), 12, "the out-of-memory cross is drawn")
        self.assertGreater(cx, box[0] + 3 * quarter, "at the largest seq")
        # naive has no point past its last run: nothing of its colour right of the cross's band below it
        below = pixels_of(picture, naive, (cx - 4, cy + 12, cx + 5, box[3]))
        self.assertLess(len(below), 4, "no point is drawn for the row that ran out of memory")
        # text: title and axis labels are dark pixels outside the plot area
        dark = pixels_of(picture, (0, 0, 0), (0, 0, w, area[1]), tol=90)
        self.assertGreater(len(dark), 50, "the title is drawn")
        dark = pixels_of(picture, (0, 0, 0), (0, area[1] + area[3] + 20, w, h), tol=90)
        self.assertGreater(len(dark), 50, "the x axis label is drawn")

    def test_page_with_two_charts(self):
        with open(os.path.join(self.dir, "page.html")) as f:
            html = f.read()
        self.assertNotIn("<script", html)
        self.assertEqual(html.count("<svg "), 2)
        picture = self.render("page.html", 800, 1100)
        first, second = (0, 60, 800, 540), (0, 540, 800, 1100)
        for box in (first, second):
            for colour in self.palette[:3]:
                self.assertGreater(len(pixels_of(picture, colour, box)), 40, f"colour {colour} in chart {box}")

    def test_every_sweep_experiment_plots(self):
        runs = {  # script and options -> (charts, x label, series labels)
            "benchmark.lua": (["--size", "tiny", "--context", "16,256", "--precision", "f32", "--steps", "1",
                               "--warmup", "0", "--memory_limit", "0.04"],
                              4, "context length (tokens), log scale", {"fwd", "fwdbwd", "step"}),
            "flash_benchmark.lua": (["--quick", "--dtype", "f32"], 4, "sequence length (tokens), log scale",
                                    {"naive, d=16", "naive, d=32", "flash, d=16", "flash, d=32"}),
            "memory_profile.lua": (["--context", "16,32", "--precision", "f32", "--out", ""], 7,
                                   "context length (tokens), log scale", {"forward", "step"}),
            "profile_kernels.lua": (["--context", "16,32", "--passes", "1", "--warmup", "0"], 6,
                                    "context length (tokens), log scale", {"eager", "fused"}),
        }
        for script, (options, charts, xlabel, series) in runs.items():
            page = os.path.join(self.dir, script + ".html")
            r = subprocess.run([TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", script), *options,
                                "--plot", page], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, f"{script}: {r.stdout}{r.stderr}")
            with open(page) as f:
                html = f.read()
            self.assertEqual(html.count("<svg "), charts, script)
            self.assertEqual(set(re.findall(r'class="xlabel">([^<]*)<', html)), {xlabel}, script)
            self.assertEqual(set(re.findall(r'<g class="series" data-label="([^"]*)"', html)), series, script)
            self.assertIn("command: ", html, script)
        # benchmark.lua ran out of memory at context 256 (and in the step at 16): crosses, no points there
        with open(os.path.join(self.dir, "benchmark.lua.html")) as f:
            first = f.read().split("</figure>")[0]
        self.assertEqual(first.count('<g class="oom"'), 4, "step at 16; fwd, fwdbwd and step at 256")
        picture = self.render("benchmark.lua.html", 800, 560)
        for colour in self.palette[:3]:
            self.assertGreater(len(pixels_of(picture, colour, (0, 100, 800, 560))), 30)

    def test_experiment_and_compare_plots(self):
        a, b = os.path.join(self.dir, "a.json"), os.path.join(self.dir, "b.json")
        for path, dtype in ((a, "f32"), (b, "bf16")):
            cmd = [TFHOST, os.path.join(ROOT, "experiments", "attention_sweep.lua"), "--seq", "32,64,128", "--d", "16",
                   "--iters", "1", "--warmup", "0", "--dtype", dtype, "--json", path,
                   "--plot", os.path.join(self.dir, f"sweep_{dtype}.html")]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("wrote " + os.path.join(self.dir, f"sweep_{dtype}.html"), r.stdout)
        with open(os.path.join(self.dir, "sweep_f32.html")) as f:
            html = f.read()
        self.assertEqual(html.count("<svg "), 3, "fwd ms, bwd ms and memory, as the table shows")
        self.assertEqual(len(re.findall(r'<g class="series" data-label="(naive|flash)"', html)), 6)
        picture = self.render("sweep_f32.html", 800, 1500)
        for colour in self.palette[:2]:
            self.assertGreater(len(pixels_of(picture, colour, (0, 0, 800, 1500))), 100)
        r = subprocess.run([TFHOST, "compare", a, b, "--metric", "fwd_ms", "--key",
                            "d,seq,impl", "--plot", os.path.join(self.dir, "cmp.svg")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.dir, "cmp.svg")) as f:
            svg = f.read()
        groups = set(re.findall(r'<g class="series" data-label="[^"]*" data-group="([^"]*)"', svg))
        self.assertEqual(groups, {"A: a.json", "B: b.json"}, "each file's rows are drawn, labelled by file")
        picture = self.render("cmp.svg", 720, 420)
        for colour in self.palette[:2]:
            self.assertGreater(len(pixels_of(picture, colour, (0, 0, 720, 420))), 60)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_plot_render.py /path/to/tfhost")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
