"""tfhost --safe's limits by default: tensor memory capped at a share of the host's and each GPU's
memory, a wall clock, both printed at start on one stderr line, both changed by --memory-limit and
--timeout (none: no limit), bad values refused with exit code 2. (The sandbox's file and process
rules: test_safe.py, whose scratch tree this file uses.)

    python3 tests/cli/test_safe_limits.py /path/to/tfhost
"""
import os
import re
import sys
import time
import unittest

import test_safe
from test_safe import Sandbox

SIZE = r"[\d.]+ (?:B|KiB|MiB|GiB|TiB)"
LIMITS_LINE = re.compile(
    r"^tfhost: safe mode: tensor memory (?P<memory>.*), Lua heap <= (?P<heap>" + SIZE + r"), "
    r"(?P<clock>wall clock .*); --memory-limit GiB, --timeout S change them \(none: no limit\)$")
DEFAULT_MEMORY = re.compile(
    r"^<= (?P<cpu>" + SIZE + r") on the CPU \(50 % of host memory\)"
    r"(?: and <= 90 % of each GPU's(?: \((?P<gpu>" + SIZE + r") on (?P<gpu_device>cuda:\d+)\))?)?$")
FOREVER = "while true do end\n"
# the allocation loop of a script one was sent; tf.empty so that the default cap (half the host's
# memory) is reached without the memory being touched
GROW_CPU = "local t = {} while true do t[#t + 1] = tf.empty(1024, 1024, 256, {device = 'cpu'}) end\n"
GROW = "local t = {} while true do t[#t + 1] = tf.zeros(1024, 1024, 64) end\n"


def host_memory():
    """What tfhost takes as the host's memory: the machine's, or a control group's cap if lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def fmt_bytes(n):
    """tfhost's way of writing a size (tf_format_bytes)."""
    units, v, u = ["B", "KiB", "MiB", "GiB", "TiB"], float(n), 0
    while v >= 1024 and u < 4:
        v, u = v / 1024, u + 1
    return f"{n} B" if u == 0 else f"{v:.2f} {units[u]}"


class Limits(Sandbox):
    def run_safe(self, *args, env=None, stdin=""):
        """A --safe run and the limits line it printed (exactly one, the first line of stderr)."""
        r = self.tfhost("--safe", *args, env=env, stdin=stdin)
        lines = [line for line in r.stderr.splitlines() if line.startswith("tfhost: safe mode:")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertEqual(r.stderr.splitlines()[0], lines[0], "the limits line comes first")
        m = LIMITS_LINE.match(lines[0])
        self.assertIsNotNone(m, lines[0])
        return r, m

    def script(self, text):
        path = os.path.join(self.work, "sent.lua")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_defaults_exist_and_are_printed(self):
        r, m = self.run_safe("-e", "print(tf.mem.stats('cpu').limit)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(m["clock"], "wall clock <= 600 s")
        self.assertEqual(m["heap"], "1.00 GiB")
        mem = DEFAULT_MEMORY.match(m["memory"])
        self.assertIsNotNone(mem, m["memory"])
        cap = int(r.stdout)
        self.assertEqual(cap, host_memory() // 2)
        self.assertEqual(mem["cpu"], fmt_bytes(cap))
        # --help says the same defaults
        usage = " ".join(self.tfhost("--help").stdout.split())
        self.assertIn("limits by default: tensor memory <= 50 % of the host's and 90 % of each GPU's, wall clock "
                      "<= 600 s", usage)
        # nothing is printed, and nothing capped, without --safe
        plain = self.tfhost("-e", "print(tf.mem.stats('cpu').limit)")
        self.assertEqual((plain.returncode, plain.stdout, plain.stderr), (0, "nil\n", ""))

    def test_infinite_loop_stops_under_the_default_timeout(self):
        # TFHOST_SAFE_TIMEOUT sets --safe's default, so that the test need not wait 600 s
        start = time.monotonic()
        r, m = self.run_safe(self.script(FOREVER), env={"TFHOST_SAFE_TIMEOUT": "1"})
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(m["clock"], "wall clock <= 1 s")
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("tfhost: --timeout: the script was stopped after 1 s of wall-clock time, --safe's default "
                      "limit (--timeout S sets another limit, --timeout none removes it)", r.stderr)

    def test_timeout_overrides(self):
        r, m = self.run_safe("--timeout", "0.5", self.script(FOREVER), env={"TFHOST_SAFE_TIMEOUT": "100"})
        self.assertEqual(m["clock"], "wall clock <= 0.5 s")
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("stopped after 0.5 s of wall-clock time (--timeout S sets another limit", r.stderr)
        # none: a run longer than the default finishes
        busy = "local t = os.time() + 2 while os.time() < t do end print('done')\n"
        for args, env in ((["--timeout", "none"], {"TFHOST_SAFE_TIMEOUT": "0.5"}), ([], {"TFHOST_SAFE_TIMEOUT": "none"})):
            with self.subTest(args=args, env=env):
                r, m = self.run_safe(*args, self.script(busy), env=env)
                self.assertEqual((r.returncode, r.stdout), (0, "done\n"), r.stderr)
                self.assertEqual(m["clock"], "wall clock not limited")
        # the REPL, where Ctrl-C stops a chunk, has no default wall clock; --timeout still applies
        r, m = self.run_safe("-i", stdin="print('hi')\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(m["clock"], "wall clock not limited in the REPL")
        r, m = self.run_safe("--timeout", "0.5", "-i", stdin=FOREVER)
        self.assertEqual(m["clock"], "wall clock <= 0.5 s")
        self.assertEqual(r.returncode, 124, r.stderr)

    def test_allocation_loop_stops_under_the_default_cap(self):
        r, m = self.run_safe(self.script(GROW_CPU))
        self.assertEqual(r.returncode, 1, r.stderr)
        cpu = DEFAULT_MEMORY.match(m["memory"])["cpu"]
        self.assertIn("sent.lua:1: out of memory: tried to allocate 1.00 GiB on cpu (", r.stderr)
        self.assertIn(f"limit {cpu}; the memory limit is reached", r.stderr)
        # a catchable error: the script goes on, and can allocate again once it lets go
        caught = f"""
local ok, err = pcall(function() {GROW_CPU} end)
print(ok, tf.mem.is_oom(err), err:find("limit {cpu}", 1, true) ~= nil)
collectgarbage() collectgarbage()
print(tf.zeros(4, {{device = 'cpu'}}):sum():item())
"""
        r, m = self.run_safe(self.script(caught))
        self.assertEqual((r.returncode, r.stdout), (0, "false\ttrue\ttrue\n0.0\n"), r.stderr)

    def test_gpu_default_cap(self):
        r, m = self.run_safe("-e", "print(tf.cuda.is_available())")
        if r.stdout.strip() != "true":
            # no GPU: the line names the CPU's cap alone (tested above)
            self.assertNotIn("GPU", m["memory"])
            return
        mem = DEFAULT_MEMORY.match(m["memory"])
        self.assertIsNotNone(mem["gpu"], m["memory"])
        device = mem["gpu_device"]
        # one allocation past the cap (refused before the device is asked, so nothing is taken)
        code = f"""
local s = tf.device_info('{device}')
local cap = tf.mem.stats('{device}').limit
print(cap == math.floor(0.9 * s.total_memory))
local ok, err = pcall(tf.empty, cap // 4 + 1024, {{device = '{device}'}})
print(ok, tf.mem.is_oom(err), err:find("limit {mem['gpu']}", 1, true) ~= nil)
"""
        r, _ = self.run_safe(self.script(code))
        self.assertEqual((r.returncode, r.stdout), (0, "true\nfalse\ttrue\ttrue\n"), r.stderr)

    def test_memory_limit_overrides(self):
        r, m = self.run_safe("--memory-limit", "0.25", self.script(GROW))
        self.assertEqual(m["memory"], "<= 256.00 MiB on every device (--memory-limit)")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("sent.lua:1: out of memory: tried to allocate 256.00 MiB", r.stderr)
        self.assertIn("limit 256.00 MiB; the memory limit is reached", r.stderr)
        r, m = self.run_safe("--memory-limit", "none", "-e", "print(tf.mem.stats('cpu').limit)")
        self.assertEqual(m["memory"], "not limited (--memory-limit none)")
        self.assertEqual((r.returncode, r.stdout), (0, "nil\n"), r.stderr)

    def test_default_cap_can_be_lowered_not_raised(self):
        lower = "tf.mem.set_limit(1 << 20, 'cpu') print(tf.mem.stats('cpu').limit)"
        r, _ = self.run_safe("-e", lower)
        self.assertEqual((r.returncode, r.stdout), (0, f"{1 << 20}\n"), r.stderr)
        for code in ("tf.mem.set_limit(nil, 'cpu')", "tf.mem.set_limit(tf.mem.stats('cpu').limit + 1, 'cpu')"):
            with self.subTest(code=code):
                r, _ = self.run_safe("-e", code)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("tf.mem.set_limit: refused: the limit cannot be raised past --safe's default cap "
                              f"({host_memory() // 2} bytes on cpu)", r.stderr)

    def test_safe_run_passes_none(self):
        code = 'print(tf.safe_run("print(tf.mem.stats(\'cpu\').limit)\\n", {timeout = "none", memory_limit = "none"}))'
        r = self.tfhost("-e", code)
        self.assertEqual((r.returncode, r.stdout), (0, "nil\ntrue\t0\n"), r.stderr)
        self.assertIn("tensor memory not limited (--memory-limit none)", r.stderr)
        self.assertIn("wall clock not limited;", r.stderr)

    def test_bad_values_are_refused(self):
        for args, env, message in (
                (["--timeout", "0"], {}, "--timeout needs a positive number of seconds up to 1e9, or none for no "
                                         "limit, not '0'"),
                (["--timeout=-1"], {}, "not '-1'"),
                (["--timeout", "nan"], {}, "not 'nan'"),
                (["--timeout", "inf"], {}, "not 'inf'"),
                (["--timeout", "1e10"], {}, "not '1e10'"),
                (["--timeout="], {}, "not ''"),
                (["--timeout", "None"], {}, "not 'None'"),
                (["--memory-limit", "0"], {}, "--memory-limit needs a positive number of GiB up to 1e9, or none for "
                                              "no limit, not '0'"),
                (["--memory-limit", "2G"], {}, "not '2G'"),
                (["--memory-limit", "1e10"], {}, "not '1e10'"),
                ([], {"TFHOST_SAFE_TIMEOUT": "0"}, "TFHOST_SAFE_TIMEOUT (--safe's default wall clock) needs a "
                                                   "positive number of seconds up to 1e9, or none, not '0'"),
                ([], {"TFHOST_SAFE_TIMEOUT": "soon"}, "not 'soon'")):
            with self.subTest(args=args, env=env):
                r = self.tfhost("--safe", *args, "-e", "print('ran')", env=env)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertIn(message, r.stderr)
                self.assertIn("(run tfhost --help for usage)", r.stderr)

    def test_bad_allow_write_is_a_usage_error(self):
        afile = os.path.join(self.work, "a_file")
        with open(afile, "w") as f:
            f.write("x")
        for args, message in (
                (["--safe", "--allow-write", "/nonexistent", "-e", "print('ran')"],
                 "tfhost: --allow-write needs a folder that exists: '/nonexistent': No such file or directory"),
                (["--safe", "--allow-write", afile, "-e", "print('ran')"],
                 f"--allow-write needs a folder that exists: '{afile}': it is not a folder"),
                # a script after the options skipped this check before
                (["--allow-write", ".", self.script("print('ran')\n")], "--allow-write needs --safe")):
            with self.subTest(args=args):
                r = self.tfhost(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertIn(message, r.stderr)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_safe_limits.py /path/to/tfhost [unittest options]")
    test_safe.TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
