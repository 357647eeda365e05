#!/usr/bin/env python3
"""tf.memviz against its readers: tfhost writes a synthetic memory snapshot
(two training steps) as a pickle, as JSON and as an HTML page, and then
  (a) Python's pickle module loads the pickle, whose structure and values
      are checked against PyTorch's snapshot format and against the JSON;
  (b) where torch is importable, torch.cuda._memory_viz reads it (trace_plot,
      segment_plot, segsum, trace) -- torch is optional: without it that part
      prints "skipped: no torch" and the rest still counts;
  (c) headless Chromium renders the page: the script must have run
      (data-status="drawn"), reported no error, and drawn a picture that is
      not blank (the PNG is decoded here with zlib);
  (d) real snapshots, of two training steps of the fused engine and of the
      eager model (tiny preset, on the default device: the GPU where there
      is one), tile every segment with their blocks, and where torch is
      importable every reader of torch.cuda._memory_viz takes them whole
      (segsum, memory, segments, trace_plot, segment_plot, compare).

Run by ctest as `python3 tests/cli/test_memviz_python.py /path/to/tfhost`.
Standard library only. Chromium is needed for (c): without it that test
fails and says so, unless TF_ALLOW_NO_CHROMIUM=1 (then it is skipped).
"""
import io
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chromium import decode_png, find_chromium  # noqa: E402

TFHOST = None  # the binary under test, from sys.argv[1]
RUN_TIMEOUT = 120
CHROMIUM_TIMEOUT = 120

# The opcodes memviz may write (protocol 2, no memo).
ALLOWED_OPCODES = {"PROTO", "EMPTY_DICT", "EMPTY_LIST", "MARK", "SETITEMS", "APPENDS", "BINUNICODE", "BININT",
                   "BININT1", "BININT2", "LONG1", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE", "TUPLE2", "TUPLE",
                   "STOP"}

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "time_us", "frames"}

# Writes into arg[1]: snapshot.{pickle,json,html}, summary.json and
# scalars.json (values with the hex of memviz.python.dumps of each).
SNAPSHOT_SCRIPT = r"""
local memviz = require "tf.memviz"
local dir = arg[1]
local KiB, MiB = 1024, 1024 * 1024
local BASE = 0x7f3a00000000
local ARENA = BASE + 64 * MiB
local next_addr, t = ARENA, 0
local trace = {}

local function frames_for(line, name)
  return { { filename = "experiments/train.lua", line = line, name = name },
           { filename = "experiments/train.lua", line = 200, name = "main" } }
end
local function alloc(size, tag, what, line, ranges)
  t = t + 7
  local e = { action = "alloc", addr = next_addr, size = size, requested_size = size - 16, stream = 0,
              time_us = t, tag = tag, what = what, source = "experiments/train.lua:" .. line, ranges = ranges,
              frames = frames_for(line, "step") }
  next_addr = next_addr + size
  trace[#trace + 1] = e
  return e
end
local function free(e)
  t = t + 7
  e.freed = true
  trace[#trace + 1] = { action = "free_completed", addr = e.addr, size = e.size, stream = 0, time_us = t,
                        tag = e.tag, what = e.what, source = e.source, ranges = e.ranges, frames = e.frames }
end

-- parameters: allocated before recording began, in the first segment
local blocks, addr = {}, BASE
for l = 1, 6 do
  local size = (4 + l) * MiB
  blocks[#blocks + 1] = { address = addr, size = size, requested_size = size, state = "active_allocated",
    tag = "parameter", what = "model.init", source = "experiments/train.lua:20", ranges = { "init" },
    frames = frames_for(20, "build") }
  addr = addr + size
end
blocks[#blocks + 1] = { address = addr, size = ARENA - addr, requested_size = 0, state = "inactive" }
local segments = { { address = BASE, total_size = ARENA - BASE, stream = 0, segment_type = "large",
                     blocks = blocks } }
trace[#trace + 1] = { action = "segment_alloc", addr = ARENA, size = 1024 * MiB, stream = 0, time_us = 1 }

local grads, states = {}, {}
for step = 1, 2 do
  local acts = {}
  for l = 1, 6 do
    local ranges = { "step " .. step, "forward", "layer " .. l }
    acts[l] = alloc((6 + l) * MiB, "activation", "matmul", 50 + l, ranges)
    local tmp = alloc(3 * MiB, "temporary", "softmax", 60 + l, ranges)
    local small = {}
    for i = 1, 20 do small[i] = alloc(4 * KiB * i, "workspace", "gemm", 70, ranges) end
    for i = 1, 20 do free(small[i]) end
    free(tmp)
  end
  for l = 6, 1, -1 do
    local ranges = { "step " .. step, "backward", "layer " .. l }
    if step == 1 then grads[l] = alloc((4 + l) * MiB, "gradient", "matmul.backward", 90 + l, ranges) end
    local tmp = alloc(2 * MiB, "temporary", "matmul.backward", 95, ranges)
    free(tmp)
    free(acts[l])
  end
  for l = 1, 6 do
    if step == 1 then
      states[l] = alloc(2 * (4 + l) * MiB, "optimizer state", "adamw", 120, { "step 1", "optimizer" })
    end
  end
end
trace[#trace + 1] = { action = "oom", size = 80 * 1024 * MiB, device_free = 512 * MiB, stream = 0, time_us = t + 1 }

-- the second segment: what the trace left live, and the free gaps
local live = {}
for _, e in ipairs(trace) do
  if e.action == "alloc" and not e.freed then live[#live + 1] = e end
end
table.sort(live, function(a, b) return a.addr < b.addr end)
local arena_blocks, at = {}, ARENA
for _, e in ipairs(live) do
  if e.addr > at then
    arena_blocks[#arena_blocks + 1] = { address = at, size = e.addr - at, requested_size = 0, state = "inactive" }
  end
  arena_blocks[#arena_blocks + 1] = { address = e.addr, size = e.size, requested_size = e.requested_size,
    state = "active_allocated", tag = e.tag, what = e.what, source = e.source, ranges = e.ranges, frames = e.frames }
  at = e.addr + e.size
end
arena_blocks[#arena_blocks + 1] = { address = at, size = ARENA + 1024 * MiB - at, requested_size = 0,
                                    state = "inactive" }
segments[2] = { address = ARENA, total_size = 1024 * MiB, stream = 0, segment_type = "large", blocks = arena_blocks }

local snap = { device = "cuda:0", device_index = 0, segments = segments, trace = trace }
local function write(name, text)
  local f = assert(io.open(dir .. "/" .. name, "wb"))
  f:write(text)
  f:close()
end
write("snapshot.pickle", memviz.pickle(snap))
write("snapshot.json", memviz.json(snap))
write("snapshot.html", memviz.html(snap, { title = "memviz test: two training steps" }))
local s = memviz.summary(snap)
tf.json.write(dir .. "/summary.json", { by_tag = s.by_tag, peak_bytes = s.peak_bytes, peak_index = s.peak_index,
                                        events = #trace })
local scalars = tf.json.array()
for _, v in ipairs({ 0, 1, 255, 256, 65535, 65536, -1, -256, 2147483647, -2147483648, 2147483648, -2147483649,
                     1 << 40, BASE, math.maxinteger, math.mininteger, 1.5, -0.25, 1e300, true, false }) do
  scalars[#scalars + 1] = { value = v, hex = (memviz.python.dumps(v):gsub(".", function(c)
    return string.format("%02x", c:byte()) end)) }
end
tf.json.write(dir .. "/scalars.json", scalars)
"""


def run_tfhost(script, *args, cwd):
    path = os.path.join(cwd, "script.lua")
    with open(path, "w") as f:
        f.write(script)
    return subprocess.run([TFHOST, path, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=cwd)


def tuples_as_lists(v):
    """The pickle's value as JSON holds it."""
    if isinstance(v, dict):
        return {k: tuples_as_lists(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [tuples_as_lists(x) for x in v]
    return v


def replay_peak(snapshot):
    """Peak live bytes by an independent replay of the trace: blocks freed
    without an alloc, and live blocks never allocated in the trace, count
    from the start."""
    live, total, unmatched = {}, 0, 0
    sizes = []
    for e in snapshot["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["action"] == "free_completed":
            if e["addr"] in live:
                total -= live.pop(e["addr"])
            else:
                unmatched += e["size"]
                total -= e["size"]
        else:
            continue
        sizes.append(total)
    before = unmatched + sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                             if b["state"] == "active_allocated" and b["address"] not in live)
    return before + max([0] + sizes)


class MemvizFiles(unittest.TestCase):
    """The files tfhost writes for one synthetic snapshot, written once."""

    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-memviz-")
        cls.dir = cls.scratch.name
        r = run_tfhost(SNAPSHOT_SCRIPT, cls.dir, cwd=cls.dir)
        if r.returncode != 0:
            raise AssertionError(f"tfhost failed:\n{r.stdout}\n{r.stderr}")
        with open(os.path.join(cls.dir, "snapshot.pickle"), "rb") as f:
            cls.pickle_bytes = f.read()
        cls.snapshot = pickle.loads(cls.pickle_bytes)
        with open(os.path.join(cls.dir, "summary.json")) as f:
            cls.summary = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    # ---- (a) the pickle, read by Python ------------------------------------

    def test_pickle_opcodes(self):
        ops = [op.name for op, _, _ in pickletools.genops(self.pickle_bytes)]
        self.assertEqual(ops[0], "PROTO")
        self.assertEqual(self.pickle_bytes[:2], b"\x80\x02")
        self.assertEqual(ops[-1], "STOP")
        self.assertLessEqual(set(ops), ALLOWED_OPCODES)
        pickletools.dis(self.pickle_bytes, out=io.StringIO())  # checks marks and the stack

    def test_scalars_are_the_bytes_cpython_writes(self):
        with open(self.path("scalars.json")) as f:
            scalars = json.load(f)
        self.assertEqual(len(scalars), 21)
        for s in scalars:
            ours = bytes.fromhex(s["hex"])
            self.assertEqual(ours, pickle.dumps(s["value"], protocol=2), s["value"])
            self.assertEqual(pickle.loads(ours), s["value"])

    def test_snapshot_structure(self):
        snap = self.snapshot
        self.assertEqual(set(snap), {"segments", "device_traces", "allocator_settings"})
        self.assertEqual(len(snap["segments"]), 2)
        self.assertEqual(len(snap["device_traces"]), 1)
        for seg in snap["segments"]:
            self.assertEqual(set(seg), SEGMENT_KEYS)
            self.assertEqual(seg["device"], 0)
            self.assertEqual(seg["segment_pool_id"], (0, 0))
            self.assertIs(seg["is_expandable"], False)
            self.assertEqual(seg["frames"], [])
            self.assertIn(seg["segment_type"], ("small", "large"))
            # the blocks tile the segment in address order (segsum asserts the sum)
            at = seg["address"]
            for b in seg["blocks"]:
                self.assertLessEqual(set(b), BLOCK_KEYS | {"user_metadata"})
                self.assertTrue(BLOCK_KEYS <= set(b))
                self.assertEqual(b["address"], at)
                at += b["size"]
                self.assertIn(b["state"], ("active_allocated", "inactive"))
                for f in b["frames"]:
                    self.assertEqual(set(f), {"filename", "line", "name"})
                    self.assertIsInstance(f["line"], int)
            self.assertEqual(at, seg["address"] + seg["total_size"])
            active = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
            self.assertEqual(seg["allocated_size"], sum(b["size"] for b in active))
            self.assertEqual(seg["requested_size"], sum(b["requested_size"] for b in active))
        params = self.snapshot["segments"][0]["blocks"]
        self.assertEqual(params[0]["address"], 0x7f3a00000000)
        self.assertEqual(params[0]["size"], 5 << 20)
        self.assertEqual(params[0]["frames"][0], {"filename": "experiments/train.lua", "line": 20,
                                                  "name": "parameter: model.init [init]"})
        self.assertEqual(params[0]["frames"][1], {"filename": "experiments/train.lua", "line": 20, "name": "build"})
        settings = snap["allocator_settings"]
        self.assertIsInstance(settings["garbage_collection_threshold"], float)
        self.assertEqual(settings["max_split_size"], -1)
        self.assertIs(settings["expandable_segments"], False)

    def test_trace_entries(self):
        trace = self.snapshot["device_traces"][0]
        counts = {}
        for e in trace:
            counts[e["action"]] = counts.get(e["action"], 0) + 1
            self.assertTrue(TRACE_KEYS <= set(e), e)
            self.assertLessEqual(set(e), TRACE_KEYS | {"addr", "device_free", "user_metadata"})
            for k in ("size", "stream", "time_us"):
                self.assertIsInstance(e[k], int)
            if e["action"] == "oom":
                self.assertNotIn("addr", e)
                self.assertEqual(e["device_free"], 512 << 20)
                self.assertEqual(e["size"], 80 << 30)
            else:
                self.assertIsInstance(e["addr"], int)
                self.assertGreater(e["addr"], 1 << 40)
        # the Lua trace: 1 segment_alloc; 2 x (6 x 22 + 6) + 6 + 6 allocs; a free for
        # each but the 12 gradients and optimizer states; one oom
        self.assertEqual(counts, {"segment_alloc": 1, "alloc": 288, "free_requested": 276, "free_completed": 276,
                                  "oom": 1})
        self.assertEqual(self.summary["events"], 1 + 288 + 276 + 1)
        for i, e in enumerate(trace):  # each free is the pair PyTorch's allocator records
            if e["action"] == "free_completed":
                self.assertEqual(trace[i - 1]["action"], "free_requested")
                self.assertEqual(trace[i - 1]["addr"], e["addr"])
        first = next(e for e in trace if e["action"] == "alloc")
        self.assertEqual(first["frames"], [
            {"filename": "experiments/train.lua", "line": 51,
             "name": "activation: matmul [step 1 > forward > layer 1]"},
            {"filename": "experiments/train.lua", "line": 51, "name": "step"},
            {"filename": "experiments/train.lua", "line": 200, "name": "main"}])
        self.assertEqual(first["user_metadata"], "activation: matmul [step 1 > forward > layer 1]")
        self.assertEqual(first["size"], 7 << 20)
        self.assertEqual(first["addr"], 0x7f3a00000000 + (64 << 20))
        times = [e["time_us"] for e in trace]
        self.assertEqual(times, sorted(times))

    def test_json_holds_the_same(self):
        with open(self.path("snapshot.json")) as f:
            self.assertEqual(json.load(f), tuples_as_lists(self.snapshot))

    def test_summary_and_page_agree_with_a_replay(self):
        peak = replay_peak(self.snapshot)
        self.assertEqual(self.summary["peak_bytes"], peak)
        self.assertEqual(sum(self.summary["by_tag"].values()), peak)
        self.assertEqual(set(self.summary["by_tag"]),
                         {"parameter", "activation", "gradient", "optimizer state", "temporary", "workspace"})
        with open(self.path("snapshot.html"), encoding="utf-8") as f:
            html = f.read()
        m = re.search(r'<text id="peak-label" data-bytes="(\d+)"[^>]*>([^<]*)</text>', html)
        self.assertIsNotNone(m)
        self.assertEqual(int(m.group(1)), peak)
        self.assertTrue(m.group(2).startswith("peak "), m.group(2))

    # ---- (b) PyTorch's own readers ------------------------------------------

    def test_torch_memory_viz_reads_it(self):
        try:
            import torch  # noqa: F401
            from torch.cuda import _memory_viz
        except ImportError:
            print("skipped: no torch", file=sys.stderr)
            self.skipTest("no torch")
        snap = self.snapshot
        for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
            page = plot(snap)
            self.assertIsInstance(page, str)
            self.assertIn("<html", page.lower())
        self.assertIn("total_reserved", _memory_viz.segsum(snap))
        self.assertIn("alloc", _memory_viz.trace(snap))

    # ---- (c) the page, rendered by Chromium ----------------------------------

    def chromium(self, *args):
        exe = find_chromium()
        if exe is None:
            reason = "chromium is not installed (apt-get install chromium; scripts/install-deps.sh installs it)"
            if os.environ.get("TF_ALLOW_NO_CHROMIUM") == "1":
                self.skipTest(reason)
            self.fail(reason + "; set TF_ALLOW_NO_CHROMIUM=1 to skip this test")
        profile = tempfile.mkdtemp(prefix="chromium-", dir=self.dir)
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
               *args, "file://" + self.path("snapshot.html")]
        r = subprocess.run(cmd, capture_output=True, timeout=CHROMIUM_TIMEOUT)
        self.assertEqual(r.returncode, 0, f"{' '.join(cmd)} failed:\n{r.stderr.decode(errors='replace')[-3000:]}")
        return r.stdout.decode("utf-8", errors="replace")

    def test_page_renders_in_chromium(self):
        dom = self.chromium("--dump-dom")
        self.assertRegex(dom, r'<body[^>]*data-status="drawn"', "the page's script ran to the end")
        errors = re.search(r'<pre id="errors">(.*?)</pre>', dom, re.S)
        self.assertIsNotNone(errors, "the page has its errors element")
        self.assertEqual(errors.group(1), "", "the page reported script errors")
        self.assertEqual(dom.count('<polygon class="alloc"'), dom.count("</polygon>") - dom.count('class="band'))

        png = self.path("snapshot.png")
        self.chromium(f"--screenshot={png}", "--window-size=1200,800")
        with open(png, "rb") as f:
            width, height, channels, rows = decode_png(f.read())
        self.assertEqual((width, height), (1200, 800))
        colours, coloured, total = set(), 0, 0
        for row in rows[::2]:
            for x in range(0, width * channels, channels * 2):
                px = row[x:x + min(channels, 3)]
                colours.add(px)
                total += 1
                if min(px) < 235:
                    coloured += 1
        self.assertGreater(len(colours), 50, "the picture has many colours")
        self.assertGreater(coloured / total, 0.25, f"only {coloured / total:.0%} of the picture is not white")


# Two training steps of each implementation with the history on, dumped as pickles.
ENGINE_SCRIPT = r"""
local dir = arg[1]
for _, impl in ipairs({"fused", "eager"}) do
  tf.mem.record{max_entries = 1 << 18}
  local m = tf.model.new{preset = "tiny", context_length = 32, impl = impl}
  local ids = tf.randint(0, m.config.vocab_size, {2, 32})
  for _ = 1, 2 do m:step(ids, ids):free() end
  tf.mem.dump(dir .. "/" .. impl .. ".pickle", tf.mem.snapshot())
  tf.mem.record(false)
  m = nil
  collectgarbage()
end
"""


class EngineSnapshots(unittest.TestCase):
    """Snapshots of real training steps, which PyTorch's readers must take whole."""

    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory(prefix="tfhost-memviz-engine-")
        r = run_tfhost(ENGINE_SCRIPT, cls.scratch.name, cwd=cls.scratch.name)
        if r.returncode != 0:
            raise AssertionError(f"tfhost failed:\n{r.stdout}\n{r.stderr}")
        cls.snaps = {}
        for impl in ("fused", "eager"):
            with open(os.path.join(cls.scratch.name, impl + ".pickle"), "rb") as f:
                cls.snaps[impl] = pickle.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def test_blocks_tile_every_segment(self):
        for impl, snap in self.snaps.items():
            self.assertTrue(snap["segments"], impl)
            for seg in snap["segments"]:
                at = seg["address"]
                for b in seg["blocks"]:
                    self.assertEqual(b["address"], at, f"{impl}: a block starts where the one before ends")
                    at += b["size"]
                self.assertEqual(at - seg["address"], seg["total_size"], f"{impl}: the blocks add up to the segment")
                active = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
                self.assertEqual(seg["allocated_size"], active, impl)

    def test_every_torch_reader_takes_them(self):
        try:
            import torch  # noqa: F401
            from torch.cuda import _memory_viz
        except ImportError:
            print("skipped: no torch", file=sys.stderr)
            self.skipTest("no torch")
        # memory, segments and compare hand their folded stacks to a flame-graph
        # script they download; the stacks themselves are what reads the snapshot
        stacks = {"format_flamegraph": lambda folded: folded}
        for impl, snap in self.snaps.items():
            self.assertIn("total_reserved", _memory_viz.segsum(snap), impl)
            for name, out in (("memory", _memory_viz.memory(snap, **stacks)),
                              ("segments", _memory_viz.segments(snap, **stacks)),
                              ("trace_plot", _memory_viz.trace_plot(snap)),
                              ("segment_plot", _memory_viz.segment_plot(snap))):
                self.assertIsInstance(out, str, f"{impl}: {name}")
                self.assertTrue(out, f"{impl}: {name}")
        # compare takes the two snapshots' segment lists, as its command line passes them
        out = _memory_viz.compare(self.snaps["fused"]["segments"], self.snaps["eager"]["segments"], **stacks)
        self.assertIsInstance(out, str)
        self.assertTrue(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_memviz_python.py /path/to/tfhost")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
