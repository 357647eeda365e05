"""tfhost --safe from the outside: every script of tests/safe/escapes tries to get out of the
sandbox (or past a limit) and must end with the error and exit code its header names, without a
crash, and without any file outside the writable folder changing (the test compares the file
system around the sandbox before and after each run). Then what --safe allows: reading beside the
script, writing in the current folder or the --allow-write one, require of the script's own
modules and tf.safe_run. (Experiments giving the same results under --safe: test_safe_experiments.py,
a file of its own so that ctest runs it beside this one.)

    python3 tests/cli/test_safe.py /path/to/tfhost

An escape script's header:  -- flags: tfhost options before the script (optional)
                            -- env: NAME=value for the run (optional)
                            -- exit: the exit code
                            -- stderr: text the error output must contain
It gets the folder outside the sandbox as arg[1] and prints ESCAPED if what it tried did not fail.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ESCAPES = os.path.join(ROOT, "tests", "safe", "escapes")
TFHOST = None
RUN_TIMEOUT = 60
CRASH_SIGNS = ("PANIC", "unprotected error", "AddressSanitizer", "runtime error:", "Segmentation", "core dumped")


def header(path):
    """The -- key: value lines at the top of an escape script."""
    fields = {"flags": [], "env": {}}
    with open(path) as f:
        for line in f:
            if not line.startswith("-- "):
                break
            key, _, value = line[3:].rstrip("\n").partition(": ")
            if key == "flags":
                fields["flags"] = value.split()
            elif key == "env":
                name, _, v = value.partition("=")
                fields["env"][name] = v
            else:
                fields[key] = value
    return fields


def snapshot(top, skip):
    """Every entry under top except those under skip: type, size, mtime and content hash. (Files
    os.tmpname would make in /tmp are not watched: other tests running beside this one make them;
    the escape tests of os.tmpname and io.tmpfile check that the call is refused before it acts.)"""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != skip]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            seen[os.path.relpath(path, top)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest,
                                                 os.readlink(path) if os.path.islink(path) else None)
    return seen


class Sandbox(unittest.TestCase):
    """A scratch tree: work/ (the current folder of each run) with links that point out of it
    and a folder allowed/, and outside/ with files an escape would read or change."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="tfhost-safe-")
        self.addCleanup(tmp.cleanup)
        self.top = os.path.realpath(tmp.name)
        self.work = os.path.join(self.top, "work")
        self.outside = os.path.join(self.top, "outside")
        os.makedirs(self.work)
        os.makedirs(self.outside)
        os.makedirs(os.path.join(self.work, "allowed"))  # for runs with --allow-write allowed
        with open(os.path.join(self.outside, "canary.txt"), "w") as f:
            f.write("canary\n")
        with open(os.path.join(self.outside, "evil.lua"), "w") as f:
            f.write('print("ESCAPED")\nio.open(arg[1] .. "/pwned", "w")\n')
        shutil.copy(os.path.join(ROOT, "tests", "fuzz", "corpus", "safetensors", "two_tensors.safetensors"),
                    os.path.join(self.outside, "w.safetensors"))
        os.symlink(self.outside, os.path.join(self.work, "link_out"))
        os.symlink(os.path.join(self.outside, "canary.txt"), os.path.join(self.work, "canary_link"))
        os.symlink(os.path.join(self.outside, "missing.txt"), os.path.join(self.work, "dangling"))
        os.symlink(os.path.join(self.outside, "evil.lua"), os.path.join(self.work, "evil_link.lua"))

    def tfhost(self, *args, env=None, cwd=None, stdin=""):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LUA_", "TFHOST_"))}
        full_env.update(env or {})
        r = subprocess.run([TFHOST, *args], cwd=cwd or self.work, env=full_env, input=stdin, capture_output=True,
                           text=True, timeout=RUN_TIMEOUT)
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, r.stderr, f"tfhost {' '.join(args)} crashed:\n{r.stderr}")
        self.assertGreaterEqual(r.returncode, 0, f"tfhost {' '.join(args)} died of signal {-r.returncode}")
        return r


class Escapes(Sandbox):
    def test_corpus_is_large(self):
        self.assertGreaterEqual(len(glob.glob(os.path.join(ESCAPES, "*.lua"))), 40)

    def test_every_escape_fails_and_touches_nothing_outside(self):
        for script in sorted(glob.glob(os.path.join(ESCAPES, "*.lua"))):
            name = os.path.basename(script)
            with self.subTest(script=name):
                h = header(script)
                self.assertIn("exit", h, f"{name} has no '-- exit:' line")
                self.assertIn("stderr", h, f"{name} has no '-- stderr:' line")
                before = snapshot(self.top, self.work)
                r = self.tfhost(*h["flags"], "--safe", script, self.outside, env=h["env"])
                self.assertEqual(snapshot(self.top, self.work), before, f"{name} changed a file outside")
                self.assertNotIn("ESCAPED", r.stdout, f"{name} got out:\n{r.stdout}")
                self.assertEqual(r.returncode, int(h["exit"]), f"{name}:\n{r.stderr}")
                self.assertIn(h["stderr"], r.stderr, name)

    def test_refusal_names_the_line_and_does_nothing(self):
        r = self.tfhost("--safe", "-e", 'io.popen("touch pwned")')
        self.assertEqual(r.returncode, 1)
        self.assertIn("(command line):1: --safe: io.popen is not available (it starts a process)", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work, "pwned")))

    def test_escape_through_stdin_script(self):
        r = self.tfhost("--safe", "-", stdin='os.execute("touch pwned")\nprint("ESCAPED")\n')
        self.assertEqual(r.returncode, 1)
        self.assertIn("--safe: os.execute is not available", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work, "pwned")))

    def test_binary_main_script_and_stdin_are_refused(self):
        chunk = os.path.join(self.work, "main.luac")
        with open(chunk, "wb") as f:
            f.write(b"\x1bLuaT\x00\x19\x93\r\n\x1a\n\x04\x08\x08")
        for args, stdin in (([chunk], ""), (["-"], "\x1bLuaT\x00"), (["-i"], "\x1bLuaT\x00\n")):
            with self.subTest(args=args):
                r = self.tfhost("--safe", *args, stdin=stdin)
                self.assertIn("attempt to load a binary chunk (mode is 't')", r.stderr)
                if args != ["-i"]:
                    self.assertEqual(r.returncode, 1)


class Allowed(Sandbox):
    def script(self, folder, name, text):
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_reads_beside_the_script_writes_in_the_current_folder(self):
        scripts = os.path.join(self.top, "scripts")
        self.script(scripts, "helper.lua", "return { answer = 42 }\n")
        self.script(scripts, "data.txt", "beside the script\n")
        main = self.script(scripts, "main.lua", """
local helper = require "helper"
local here = arg[0]:match("^(.*)/") or "."
local text = io.open(here .. "/data.txt"):read("l")
local rows = { { answer = helper.answer, text = text } }
tf.results.write("results.json", rows)
tf.json.write("sub.json", { ok = true })
tf.safetensors.save("w.safetensors", { w = tf.arange(4) })
local back = tf.safetensors.load("w.safetensors")
print("sum", back.w:sum():item())
os.rename("sub.json", "renamed.json")
os.remove("renamed.json")
print("ok", collectgarbage("count") > 0, os.getenv("HOME") ~= nil, os.clock() >= 0)
""")
        r = self.tfhost("--safe", main)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("sum\t6", r.stdout)
        with open(os.path.join(self.work, "results.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["results"], [{"answer": 42, "text": "beside the script"}])
        self.assertFalse(os.path.exists(os.path.join(self.work, "renamed.json")))
        # ... but the script's folder is not writable
        r = self.tfhost("--safe", "-e", f'io.open("{scripts}/x.txt", "w")', main)
        self.assertEqual(r.returncode, 1)
        self.assertIn("it is outside the writable folders", r.stderr)

    def test_allow_write_moves_the_writable_folder(self):
        out = os.path.join(self.top, "out")
        os.makedirs(out)
        code = f'tf.results.write("{out}/r.json", {{}}) io.open("{out}/a.txt", "w"):write("a") print("done")'
        r = self.tfhost("--safe", "--allow-write", out, "-e", code)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "r.json")))
        r = self.tfhost("--safe", "--allow-write", out, "-e", 'io.open("here.txt", "w")')
        self.assertEqual(r.returncode, 1)
        self.assertIn("--safe: io.open: cannot write 'here.txt'", r.stderr)

    def test_option_errors(self):
        for args, message in ((["--timeout", "0"], "--timeout needs a positive number"),
                              (["--timeout=abc"], "--timeout needs a positive number"),
                              (["--memory-limit", "-1"], "--memory-limit needs a positive number"),
                              (["--memory-limit", "-e"], "--memory-limit needs a positive number of GiB up to 1e9, "
                                                         "or none for no limit, not '-e'"),
                              (["--allow-write", "."], "--allow-write needs --safe")):
            with self.subTest(args=args):
                r = self.tfhost(*args, "-e", "print(1)")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)

    def test_limits_without_safe(self):
        r = self.tfhost("--timeout", "1", "-e", "while true do end")
        self.assertEqual(r.returncode, 124)
        self.assertIn("--timeout: the script was stopped after 1 s", r.stderr)
        r = self.tfhost("--memory-limit", "0.5", "-e", "print(tf.mem.stats('cpu').limit)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), str(1 << 29))
        r = self.tfhost("--memory-limit", "0.5", "-e", "tf.mem.set_limit(1 << 20, 'cpu') print(tf.mem.stats('cpu').limit)")
        self.assertEqual(r.stdout.strip(), str(1 << 20), r.stderr)

    def test_lua_heap_is_bounded_under_safe(self):
        r = self.tfhost("--safe", "-e", "print(tf.sysinfo().lua_heap_limit)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLessEqual(int(r.stdout), 1 << 30)

    def test_safe_run_from_a_script(self):
        child = self.script(self.work, "child.lua", 'print("child", ...)\nio.open("child.txt", "w"):write("c")\n')
        code = """
local ok, code = tf.safe_run("child.lua", { args = { "a", "b" } })
print("file", ok, code)
ok, code = tf.safe_run("os.execute('touch pwned')\\n")
print("refused", ok, code)
ok, code = tf.safe_run("while true do end\\n", { timeout = 1 })
print("timeout", ok, code)
"""
        r = self.tfhost("-e", code)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("child\ta\tb", r.stdout)
        self.assertIn("file\ttrue\t0", r.stdout)
        self.assertIn("refused\tfalse\t1", r.stdout)
        self.assertIn("timeout\tfalse\t124", r.stdout)
        self.assertIn("--safe: os.execute is not available", r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.work, "child.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.work, "pwned")))
        self.assertTrue(os.path.exists(child))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_safe.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
