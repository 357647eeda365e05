#!/usr/bin/env python3
"""Command-line tests of tfhost: exit codes, error reports, `arg`, -e/-l,
script options, the REPL (through a pipe and through a pseudo-terminal) and
Ctrl-C.

Run by ctest as `python3 tests/cli/test_cli.py /path/to/tfhost`. Standard
library only. Every child process runs with a timeout, and every read from a
pseudo-terminal has a deadline, so a hang fails a test instead of blocking.
"""
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import termios
import textwrap
import time
import unittest

TFHOST = None  # the binary under test, from sys.argv[1]
RUN_TIMEOUT = 20  # seconds for any one tfhost run
READ_TIMEOUT = 10  # seconds to wait for expected output on a pty

# Environment variables that would change what tfhost does.
LUA_ENV = ("TFHOST_LUA_MEMORY", "LUA_PATH", "LUA_PATH_5_4", "LUA_CPATH", "LUA_CPATH_5_4",
           "LUA_INIT", "LUA_INIT_5_4")

OPTIONS_SCRIPT = """\
local opt = tf.options{
  description = "Options test script",
  {"steps", "timed steps", default = 10},
  {"lr", "learning rate", default = 0.5},
  {"verbose", "print more", type = "bool"},
  {"fast", "go fast", default = true},
  {"size", "model sizes", default = "small", type = "list"},
  {"batch", "batch sizes", default = "1,2", type = "list:int"},
  {"mode", "run mode", default = "train", choices = {"train", "eval"}},
  {"name", "a name", type = "string"},
}
print("steps", math.type(opt.steps), opt.steps)
print("lr", math.type(opt.lr), opt.lr)
print("verbose", type(opt.verbose), opt.verbose)
print("fast", type(opt.fast), opt.fast)
print("size", #opt.size, table.concat(opt.size, "+"))
print("batch", #opt.batch, math.type(opt.batch[1]), table.concat(opt.batch, "+"))
print("mode", opt.mode)
print("name", opt.name)
print("args", #opt.args, table.concat(opt.args, "+"))
"""


class TfhostTest(unittest.TestCase):
    """Runs tfhost in a scratch directory and checks what every run must
    satisfy: no death by signal, no Lua panic."""

    def setUp(self):
        scratch = tempfile.TemporaryDirectory(prefix="tfhost-cli-")
        self.addCleanup(scratch.cleanup)
        self.tmp = scratch.name
        self.home = os.path.join(self.tmp, "home")  # the REPL keeps its history here
        os.mkdir(self.home)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if k not in LUA_ENV}
        env["HOME"] = self.home
        env.update(extra)
        return env

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def check_sane(self, code, out, err):
        self.assertGreaterEqual(code, 0, f"tfhost died from signal {-code}\nstdout:\n{out}\nstderr:\n{err}")
        self.assertNotIn("PANIC", out + err)
        self.assertNotIn("unprotected error", err)

    def tfhost(self, *args, stdin=None, cwd=None, env=None):
        """Runs tfhost with args in the scratch directory; returns the
        CompletedProcess (text mode)."""
        r = subprocess.run([TFHOST, *args], input=stdin if stdin is not None else "",
                           capture_output=True, text=True, cwd=cwd or self.tmp,
                           env=env or self.env(), timeout=RUN_TIMEOUT)
        self.check_sane(r.returncode, r.stdout, r.stderr)
        return r

    def assertExit(self, r, code):
        self.assertEqual(r.returncode, code, f"exit code of {r.args}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")

    def assertUsageError(self, r, message):
        self.assertExit(r, 2)
        self.assertIn(message, r.stderr)
        self.assertEqual(r.stdout, "")

    def assertScriptError(self, r, message, traceback=True):
        """Exit code 1 and `tfhost: message` on stderr, with a traceback."""
        self.assertExit(r, 1)
        self.assertIn("tfhost: " + message, r.stderr)
        if traceback:
            self.assertIn("stack traceback:", r.stderr)

    def cuda_available(self):
        r = self.tfhost("-e", "io.write(tostring(tf.cuda.is_available()))")
        self.assertExit(r, 0)
        return r.stdout == "true"


class ExitCodesAndUsage(TfhostTest):
    def test_success_exits_0(self):
        r = self.tfhost("-e", "print(1 + 1)")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "2\n")
        self.assertEqual(r.stderr, "")

    def test_unknown_tfhost_option(self):
        for option in ("--bogus", "-x", "-ie", "--devices=cpu"):
            with self.subTest(option=option):
                r = self.tfhost(option, "-e", "print('ran')")
                self.assertUsageError(r, f"tfhost: unrecognized option '{option}'")
                self.assertIn("tfhost --help", r.stderr)

    def test_option_without_value(self):
        for option in ("-e", "-l", "--device", "--seed"):
            with self.subTest(option=option):
                r = self.tfhost(option)
                self.assertUsageError(r, f"tfhost: option '{option}' needs an argument")

    def test_bad_device_name(self):
        for device in ("tpu", "cuda:x", "cuda:-1", ""):
            with self.subTest(device=device):
                r = self.tfhost("--device=" + device, "-e", "print('ran')")
                self.assertUsageError(r, f"tfhost: --device: unknown device '{device}'")

    def test_device_cuda_needs_a_gpu(self):
        r = self.tfhost("--device", "cuda", "-e", "print(tf.default_device())")
        if self.cuda_available():
            self.assertExit(r, 0)
            self.assertEqual(r.stdout, "cuda:0\n")
        else:
            self.assertUsageError(r, "tfhost: --device: no CUDA device")

    def test_device_cpu_becomes_the_default(self):
        for args in (["--device", "cpu"], ["--device=cpu"]):
            with self.subTest(args=args):
                r = self.tfhost(*args, "-e", "print(tf.default_device(), tf.zeros(1).device)")
                self.assertExit(r, 0)
                self.assertEqual(r.stdout, "cpu\tcpu\n")

    def test_seed_not_an_integer(self):
        # 99999999999999999999 used to be clamped silently to 2^63-1 (main.c).
        for seed in ("abc", "1.5", "", "12x", "99999999999999999999"):
            with self.subTest(seed=seed):
                r = self.tfhost("--seed", seed, "-e", "print('ran')")
                self.assertUsageError(r, f"tfhost: --seed needs an integer, not '{seed}'")

    def test_seed_reaches_the_engine(self):
        for args, seed in ((["--seed", "42"], "42"), (["--seed=7"], "7"), (["--seed", "-1"], "-1")):
            with self.subTest(args=args):
                r = self.tfhost(*args, "-e", "print(tf.initial_seed())")
                self.assertExit(r, 0)
                self.assertEqual(r.stdout, seed + "\n")

    def test_threads(self):
        for args, env, want in ((["--threads", "3"], {}, "3"), (["--threads=1"], {}, "1"),
                                ([], {"TF_NUM_THREADS": "2"}, "2"),
                                (["--threads", "1"], {"TF_NUM_THREADS": "2"}, "1")):
            with self.subTest(args=args, env=env):
                r = self.tfhost(*args, "-e", "print(tf.threads(), tf.sysinfo().threads)", env=dict(self.env(), **env))
                self.assertExit(r, 0)
                self.assertEqual(r.stdout, f"{want}\t{want}\n")
        for bad in ("0", "abc", "5000", ""):
            with self.subTest(threads=bad):
                r = self.tfhost("--threads", bad, "-e", "print('ran')")
                self.assertUsageError(r, f"tfhost: --threads needs a count in 1..4096, not '{bad}'")
        r = self.tfhost("-e", "print('ran')", env=dict(self.env(), TF_NUM_THREADS="x"))
        self.assertUsageError(r, "tfhost: TF_NUM_THREADS must be a count in 1..4096, not 'x'")

    def test_blas_kernels(self):
        # OpenBLAS falls back to generic SSE3 kernels on CPUs it does not recognise; tfhost then
        # starts again with the best kernels the CPU allows, unless OPENBLAS_CORETYPE says otherwise
        probe = "print(tf.sysinfo().blas)"
        r = self.tfhost("-e", probe, env={k: v for k, v in self.env().items() if k != "OPENBLAS_CORETYPE"})
        self.assertExit(r, 0)
        if "OpenBLAS" not in r.stdout:
            self.skipTest("this build's BLAS is not OpenBLAS: " + r.stdout.strip())
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        if "avx2" in flags and "fma" in flags:
            for generic in ("Prescott", "Core2", "Unknown"):
                self.assertNotIn(f" {generic} ", r.stdout)
        r = self.tfhost("-e", probe, env=dict(self.env(), OPENBLAS_CORETYPE="Prescott"))
        self.assertExit(r, 0)
        self.assertIn(" Prescott ", r.stdout)  # the environment's choice is kept, and runs
        r = self.tfhost("-e", "print(tf.matmul(tf.ones(3, 4), tf.ones(4, 2)):sum():item())",
                        env=dict(self.env(), OPENBLAS_CORETYPE="Prescott"))
        self.assertEqual(r.stdout, "24.0\n")

    def test_omp_wait_policy(self):
        # OpenMP's threads sleep when they wait unless the environment chose: tfhost starts again
        # with OMP_WAIT_POLICY=passive where neither it nor GOMP_SPINCOUNT is set
        probe = "print(os.getenv('OMP_WAIT_POLICY'), os.getenv('GOMP_SPINCOUNT'))"
        bare = {k: v for k, v in self.env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        for extra, want in (({}, "passive\tnil\n"), ({"OMP_WAIT_POLICY": "active"}, "active\tnil\n"),
                            ({"GOMP_SPINCOUNT": "1000"}, "nil\t1000\n")):
            with self.subTest(env=extra):
                r = self.tfhost("-e", probe, env=dict(bare, **extra))
                self.assertEqual((r.returncode, r.stdout), (0, want), r.stderr)
        # the arguments survive the second start
        script = self.write("args.lua", "print(select('#', ...), ...)\n")
        r = self.tfhost(script, "a b", "", "-x", env=bare)
        self.assertEqual((r.returncode, r.stdout), (0, "3\ta b\t\t-x\n"), r.stderr)

    def test_help(self):
        for option in ("--help", "-h"):
            with self.subTest(option=option):
                r = self.tfhost(option)
                self.assertExit(r, 0)
                self.assertTrue(r.stdout.startswith("usage: tfhost [options] [script [args]]\n"), r.stdout)
                for listed in ("-e stat", "-l mod", "-i", "-v", "-W", "--device DEV", "--seed N", "TFHOST_LUA_MEMORY"):
                    self.assertIn(listed, r.stdout)
                self.assertEqual(r.stderr, "")

    def test_version(self):
        r = self.tfhost("-v")
        self.assertExit(r, 0)
        self.assertRegex(r.stdout, r"^tfhost \S+ \(commit \S+\), Lua 5\.4\.\d+, .*backend.*\n$")
        self.assertEqual(r.stderr, "")

    def test_version_then_exec(self):
        r = self.tfhost("-v", "-e", "print('after')")
        self.assertExit(r, 0)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 2, r.stdout)
        self.assertTrue(lines[0].startswith("tfhost "), r.stdout)
        self.assertEqual(lines[1], "after")


class ScriptErrors(TfhostTest):
    def test_runtime_error(self):
        self.write("rt.lua", """\
            print("before")
            local x = nil
            print(x.field)
            """)
        r = self.tfhost("rt.lua")
        self.assertScriptError(r, "rt.lua:3: attempt to index a nil value (local 'x')")
        self.assertIn("rt.lua:3: in main chunk", r.stderr)
        self.assertEqual(r.stdout, "before\n")

    def test_error_in_a_function_names_it(self):
        self.write("fn.lua", """\
            local function check(v)
              if not v then error("check failed") end
            end
            check(false)
            """)
        r = self.tfhost("fn.lua")
        self.assertScriptError(r, "fn.lua:2: check failed")
        self.assertIn("fn.lua:2: in local 'check'", r.stderr)
        self.assertIn("fn.lua:4: in main chunk", r.stderr)

    def test_error_inside_a_called_scope_keeps_its_frames(self):
        # tf.mem.scope(tag, what, fn) runs fn with the scope as a to-be-closed variable, not under a
        # protected call, so the traceback goes down into fn; and the scope is left on the way up
        self.write("scoped.lua", """\
            local function inner() error("deep down") end
            local function middle() inner() end
            local ok = pcall(tf.mem.scope, "parameter", "w", function() middle() end)
            assert(not ok)
            tf.mem.record(true, "cpu")
            local t = tf.no_grad(function() return tf.ones({4}, {device = "cpu"}) * 2 end)
            local tag
            for _, s in ipairs(tf.mem.snapshot("cpu").segments) do
              for _, blk in ipairs(s.blocks) do
                if blk.address == t:data_ptr() then tag = blk.tag end
              end
            end
            print("after the error: " .. tostring(tag))
            tf.mem.scope("parameter", "w", function() middle() end)
            """)
        r = self.tfhost("scoped.lua")
        self.assertScriptError(r, "scoped.lua:1: deep down")
        self.assertIn("after the error: temporary\n", r.stdout)
        self.assertIn("scoped.lua:1: in upvalue 'inner'", r.stderr)
        self.assertIn("scoped.lua:2: in upvalue 'middle'", r.stderr)
        self.assertIn("in field 'scope'", r.stderr)
        self.assertIn("scoped.lua:14: in main chunk", r.stderr)

    def test_syntax_error(self):
        self.write("syn.lua", "print('ok')\nx = = 1\n")
        r = self.tfhost("syn.lua")
        # As in lua.c, a chunk that does not compile has no traceback.
        self.assertScriptError(r, "syn.lua:2: unexpected symbol near '='", traceback=False)
        self.assertEqual(r.stdout, "")

    def test_missing_script(self):
        r = self.tfhost("no_such_script.lua")
        self.assertScriptError(r, "cannot open no_such_script.lua", traceback=False)

    def test_error_in_exec_option(self):
        r = self.tfhost("-e", "error('boom')")
        self.assertScriptError(r, "(command line):1: boom")

    def test_error_object_table(self):
        r = self.tfhost("-e", "error({code = 1})")
        self.assertScriptError(r, "(error object is a table value)")

    def test_error_object_nil(self):
        r = self.tfhost("-e", "error(nil)")
        self.assertScriptError(r, "(error object is a nil value)")

    def test_error_object_with_tostring(self):
        r = self.tfhost("-e", "error(setmetatable({}, {__tostring = function() return 'custom error object' end}))")
        self.assertScriptError(r, "custom error object")
        self.assertIn("(command line):1: in main chunk", r.stderr)

    def test_error_object_tostring_not_a_string(self):
        r = self.tfhost("-e", "error(setmetatable({}, {__tostring = function() return 42 end}))")
        self.assertScriptError(r, "(error object is a table value)")

    def test_error_inside_close(self):
        self.write("close.lua", """\
            do
              local guard <close> = setmetatable({}, {__close = function() error("closing failed") end})
              print("in block")
            end
            print("not reached")
            """)
        r = self.tfhost("close.lua")
        self.assertScriptError(r, "close.lua:2: closing failed")
        self.assertIn("in metamethod 'close'", r.stderr)
        self.assertEqual(r.stdout, "in block\n")

    def test_stack_overflow(self):
        r = self.tfhost("-e", "local function f(n) return 1 + f(n + 1) end f(1)")
        self.assertScriptError(r, "(command line):1: stack overflow")
        self.assertIn("in upvalue 'f'", r.stderr)

    def test_c_stack_overflow(self):
        r = self.tfhost("-e", "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x")
        self.assertScriptError(r, "(command line):1: C stack overflow")

    def test_error_inside_gc_is_a_warning(self):
        script = "setmetatable({}, {__gc = function() error('finaliser failed') end}) collectgarbage() print('done')"
        r = self.tfhost("-e", script)
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "done\n")
        self.assertEqual(r.stderr, "")
        r = self.tfhost("-W", "-e", script)
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "done\n")
        self.assertIn("tfhost: warning: error in __gc", r.stderr)
        self.assertIn("(command line):1: finaliser failed", r.stderr)

    def test_error_inside_gc_at_exit(self):
        # The object is still reachable when the script ends: lua_close runs it.
        r = self.tfhost("-W", "-e", "keep = setmetatable({}, {__gc = function() error('late finaliser') end})")
        self.assertExit(r, 0)
        self.assertIn("tfhost: warning: error in __gc", r.stderr)
        self.assertIn("late finaliser", r.stderr)

    def test_warnings(self):
        r = self.tfhost("-e", "warn('hidden')")
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "")
        r = self.tfhost("-W", "-e", "warn('shown ', 'in pieces') warn('@off') warn('hidden')")
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "tfhost: warning: shown in pieces\n")

    def test_lua_heap_exhaustion(self):
        r = self.tfhost("-e", "local t, i = {}, 0 while true do i = i + 1 t[i] = i end",
                        env=self.env(TFHOST_LUA_MEMORY="64M"))
        self.assertExit(r, 1)
        # the script's line, as every error gives it, then a traceback
        self.assertIn("tfhost: (command line):1: not enough memory (Lua heap: ", r.stderr)
        self.assertIn("limit 64 MiB", r.stderr)
        self.assertIn("stack traceback:", r.stderr)

    def test_lua_heap_exhaustion_is_catchable_at_its_line(self):
        script = ("local ok, err = pcall(function()\n"
                  "  local t, i = {}, 0\n"
                  "  while true do i = i + 1 t[i] = string.rep('x', 1000) .. i end\n"
                  "end)\n"
                  "collectgarbage()\n"
                  "print(ok, err)\n"
                  "local again = pcall(function() local t = {} for i = 1, 1e9 do t[i] = {i} end end)\n"
                  "collectgarbage()\n"
                  "print('again', again, tf.ones(2):sum():item())\n")
        r = self.tfhost("-e", script, env=self.env(TFHOST_LUA_MEMORY="64M"))
        self.assertExit(r, 0)
        self.assertIn("false\t(command line):3: not enough memory (Lua heap: ", r.stdout)
        self.assertIn("again\tfalse\t2.0", r.stdout, "caught a second time, and the runtime still works")

    def test_heap_too_small_for_the_runtime(self):
        r = self.tfhost("-e", "print('ran')", env=self.env(TFHOST_LUA_MEMORY="8K"))
        self.assertExit(r, 1)
        self.assertIn("not enough memory", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_tensor_op_error_names_the_function(self):
        r = self.tfhost("-e", "local t = tf.zeros(-1)")
        self.assertScriptError(r, "(command line):1: bad argument #1 to 'zeros' (negative size -1 for dimension 0)")
        # Lua names C functions by a search of package.loaded: tf's functions
        # are reachable only through tf, so the name is always tf.zeros.
        self.assertIn("[C]: in function 'tf.zeros'", r.stderr)

    def test_tensor_binary_op_error(self):
        r = self.tfhost("-e", "local t = tf.zeros(2) + tf.zeros(3)")
        self.assertScriptError(r, "(command line):1: tf.add: shapes (2,) and (3,) cannot be broadcast")

    def test_use_after_free_is_an_error(self):
        r = self.tfhost("-e", "local t = tf.zeros(2) t:free() print(t:sum())")
        self.assertScriptError(r, "(command line):1: calling 'sum' on bad self (tensor has been freed)")


class ExitFunction(TfhostTest):
    def test_exit_code_and_message(self):
        r = self.tfhost("-e", "tf.exit(4, 'leaving\\n') print('not reached')")
        self.assertExit(r, 4)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, "leaving\n")
        r = self.tfhost("-e", "tf.exit(0, 'fine\\n')")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "fine\n")
        self.assertEqual(r.stderr, "")
        r = self.tfhost("-e", "tf.exit(0, 'bye')")  # the line is ended for it
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "bye\n")
        r = self.tfhost("-e", "tf.exit(2, 'no')")
        self.assertEqual(r.stderr, "no\n")

    def test_exit_unwinds_close_variables(self):
        r = self.tfhost("-e", "local x <close> = setmetatable({}, {__close = function() print('closed') end}) tf.exit(3)")
        self.assertExit(r, 3)
        self.assertEqual(r.stdout, "closed\n")

    def test_exit_from_a_coroutine(self):
        r = self.tfhost("-e", "coroutine.wrap(function() tf.exit(5) end)()")
        self.assertExit(r, 5)
        self.assertEqual(r.stderr, "")

    def test_exit_with_boolean(self):
        # Used to fail with "number expected, got boolean" (luahost.c).
        for value, code in (("true", 0), ("false", 1)):
            with self.subTest(value=value):
                r = self.tfhost("-e", f"tf.exit({value})")
                self.assertExit(r, code)
                self.assertEqual(r.stderr, "")

    def test_exit_code_out_of_range(self):
        # tf.exit(256) used to exit with status 0 (256 cut to 8 bits): luahost.c.
        for value in ("256", "-1"):
            with self.subTest(value=value):
                r = self.tfhost("-e", f"tf.exit({value})")
                self.assertScriptError(r, "(command line):1: bad argument #1 to 'exit' (exit code must be in 0..255)")


class ArgumentsAndModules(TfhostTest):
    ARGS_SCRIPT = """\
        local parts = {}
        for i = -4, 3 do parts[#parts + 1] = i .. "=" .. tostring(arg[i]) end
        print(table.concat(parts, " "))
        print("varargs", select("#", ...), ...)
        """

    def test_arg_table_and_varargs(self):
        self.write("args.lua", self.ARGS_SCRIPT)
        r = self.tfhost("--seed", "3", "-W", "args.lua", "x", "--y")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout.splitlines(), [
            f"-4={TFHOST} -3=--seed -2=3 -1=-W 0=args.lua 1=x 2=--y 3=nil",
            "varargs\t2\tx\t--y",
        ])

    def test_double_dash_ends_tfhost_options(self):
        self.write("args.lua", self.ARGS_SCRIPT)
        r = self.tfhost("--", "args.lua", "--seed", "-e")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout.splitlines(), [
            f"-4=nil -3=nil -2={TFHOST} -1=-- 0=args.lua 1=--seed 2=-e 3=nil",
            "varargs\t2\t--seed\t-e",
        ])

    def test_dash_runs_stdin(self):
        r = self.tfhost("-", "a", "b", stdin="print(arg[0], arg[1], arg[2], ...)\n")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "-\ta\tb\ta\tb\n")

    def test_dash_stdin_error_names_stdin(self):
        r = self.tfhost("-", stdin="\nerror('from stdin')\n")
        self.assertScriptError(r, "stdin:2: from stdin")

    def test_piped_stdin_without_script(self):
        r = self.tfhost(stdin="print('from stdin', select('#', ...))\n")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "from stdin\t0\n")
        r = self.tfhost(stdin="local x = nil\nprint(x.y)\n")
        self.assertScriptError(r, "stdin:2: attempt to index a nil value (local 'x')")

    def test_piped_expression_line_says_stdin_is_a_script(self):
        for args in ((), ("-",)):
            r = self.tfhost(*args, stdin="x = tf.ones(2)\nx\n")
            self.assertExit(r, 1)
            self.assertIn("stdin:", r.stderr)
            self.assertIn("stdin is read as one script", r.stderr)
            self.assertIn("tfhost -i", r.stderr)
        r = self.tfhost("-i", stdin="x = tf.ones(2)\nx\n")  # the REPL prints the expression
        self.assertExit(r, 0)
        self.assertIn("1", r.stdout)

    def test_exec_options_run_in_order_before_the_script(self):
        self.write("greet.lua", "print(greeting .. ' from script', counter)\n")
        r = self.tfhost("-e", "counter = 1", "-ecounter = counter * 10", "-e", "greeting = 'hi'", "greet.lua")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "hi from script\t10\n")

    def test_exec_error_stops_before_the_script(self):
        self.write("greet.lua", "print('script ran')\n")
        r = self.tfhost("-e", "error('early')", "greet.lua")
        self.assertScriptError(r, "(command line):1: early")
        self.assertEqual(r.stdout, "")

    def test_library_option(self):
        r = self.tfhost("-l", "s=string", "-lutf8", "-e", "print(s.rep('ab', 2), utf8 == require('utf8'))")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "abab\ttrue\n")

    def test_library_option_on_package_path(self):
        self.write("lib/mymod.lua", "return {answer = function() return 42 end}\n")
        env = self.env(LUA_PATH=os.path.join(self.tmp, "lib", "?.lua") + ";;")
        r = self.tfhost("-l", "g=mymod", "-l", "mymod", "-e", "print(g.answer(), mymod.answer(), g == mymod)", env=env)
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "42\t42\ttrue\n")

    def test_library_option_missing_module(self):
        r = self.tfhost("-l", "no_such_module_xyz", "-e", "print('ran')")
        self.assertScriptError(r, "module 'no_such_module_xyz' not found")
        self.assertEqual(r.stdout, "")

    def test_require_finds_modules_next_to_the_script(self):
        self.write("proj/main.lua", """\
            local helper = require "helper"
            local pkg = require "pkg"
            print(helper.greet("tf"), pkg.name)
            """)
        self.write("proj/helper.lua", "return {greet = function(who) return 'hello ' .. who end}\n")
        self.write("proj/pkg/init.lua", "return {name = 'pkg'}\n")
        # Run from elsewhere: the directory that counts is the script's.
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.mkdir(elsewhere)
        r = self.tfhost(os.path.join("..", "proj", "main.lua"), cwd=elsewhere)
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "hello tf\tpkg\n")

    def test_error_in_a_required_module(self):
        self.write("proj/main.lua", "require 'broken'\n")
        self.write("proj/broken.lua", "local x = 1\nerror('module is broken')\n")
        r = self.tfhost("proj/main.lua")
        self.assertScriptError(r, "proj/broken.lua:2: module is broken")
        self.assertIn("in function 'require'", r.stderr)

    def test_shebang_line_is_skipped(self):
        self.write("shebang.lua", "#!/usr/bin/env tfhost\nprint('shebang ok')\n")
        r = self.tfhost("shebang.lua")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "shebang ok\n")


class ScriptOptions(TfhostTest):
    def setUp(self):
        super().setUp()
        self.write("opts.lua", OPTIONS_SCRIPT)

    def parse(self, *args):
        r = self.tfhost("opts.lua", *args)
        self.assertExit(r, 0)
        return dict(line.split("\t", 1) for line in r.stdout.splitlines())

    def test_help_lists_options_with_defaults(self):
        r = self.tfhost("opts.lua", "--help")
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "")
        out = r.stdout
        self.assertTrue(out.startswith("usage: tfhost opts.lua [options]\nOptions test script\n"), out)
        self.assertNotIn("steps\t", out)  # the script stops at tf.options
        expected = [
            r"--steps INT\s+timed steps \(default: 10\)",
            r"--lr NUM\s+learning rate \(default: 0\.5\)",
            r"--verbose\s+print more \(default: false\)",
            r"--fast\s+go fast \(default: true\)",
            r"--size LIST\s+model sizes \(default: small\)",
            r"--batch INTS\s+batch sizes \(default: 1,2\)",
            r"--mode STR\s+run mode \[train\|eval\] \(default: train\)",
            r"--name STR\s+a name\n",
            r"-h, --help\s+show this help",
        ]
        for pattern in expected:
            self.assertRegex(out, pattern)
        self.assertEqual(self.tfhost("opts.lua", "-h").stdout, out)

    def test_defaults_are_typed(self):
        v = self.parse()
        self.assertEqual(v["steps"], "integer\t10")
        self.assertEqual(v["lr"], "float\t0.5")
        self.assertEqual(v["verbose"], "boolean\tfalse")
        self.assertEqual(v["fast"], "boolean\ttrue")
        self.assertEqual(v["size"], "1\tsmall")
        self.assertEqual(v["batch"], "2\tinteger\t1+2")
        self.assertEqual(v["mode"], "train")
        self.assertEqual(v["name"], "nil")
        self.assertEqual(v["args"], "0\t")

    def test_values_are_typed(self):
        v = self.parse("--steps=5", "--lr", "0.25", "--verbose", "--no-fast", "--size", "a, b",
                       "--batch=4,8,16", "--mode", "eval", "--name=x=y", "pos1", "--", "--pos2")
        self.assertEqual(v["steps"], "integer\t5")
        self.assertEqual(v["lr"], "float\t0.25")
        self.assertEqual(v["verbose"], "boolean\ttrue")
        self.assertEqual(v["fast"], "boolean\tfalse")
        self.assertEqual(v["size"], "2\ta+b")
        self.assertEqual(v["batch"], "3\tinteger\t4+8+16")
        self.assertEqual(v["mode"], "eval")
        self.assertEqual(v["name"], "x=y")
        self.assertEqual(v["args"], "2\tpos1+--pos2")

    def test_bool_values_and_negative_numbers(self):
        v = self.parse("--verbose=yes", "--fast=off", "--steps", "-3", "--lr=-1e-3")
        self.assertEqual(v["verbose"], "boolean\ttrue")
        self.assertEqual(v["fast"], "boolean\tfalse")
        self.assertEqual(v["steps"], "integer\t-3")
        self.assertEqual(v["lr"], "float\t-0.001")

    def test_usage_errors(self):
        cases = [
            (["--steps", "abc"], "option '--steps' expects an integer"),
            (["--steps", "1.5"], "option '--steps' expects an integer"),
            (["--lr=fast"], "option '--lr' expects a number"),
            (["--bogus"], "unknown option '--bogus'"),
            (["--no-steps"], "unknown option '--no-steps'"),
            (["-x"], "unknown option '-x'"),
            (["--mode", "test"], "option '--mode' must be one of train, eval (got test)"),
            (["--batch", "1,x"], "option '--batch' expects a comma-separated list of ints"),
            (["--size="], "option '--size' expects at least one value"),
            (["--steps"], "option '--steps' needs a value"),
            (["--no-fast=true"], "option '--no-fast' takes no value"),
            (["--verbose=maybe"], "option '--verbose' expects true or false"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                r = self.tfhost("opts.lua", *args)
                self.assertUsageError(r, f"opts.lua: {message} (see opts.lua --help)")

    def test_bad_declaration_is_a_script_error(self):
        self.write("baddecl.lua", "local x = 1\nlocal opt = tf.options{{'a', type = 'foo'}}\n")
        r = self.tfhost("baddecl.lua")
        self.assertScriptError(r, "baddecl.lua:2: tf.options: option 'a' has unknown type 'foo'")

    # A default outside its choices would run the script with a value no
    # user could pass: the declaration is refused.
    def test_default_outside_choices_is_rejected(self):
        self.write("choice.lua", "local opt = tf.options{{'mode', 'run mode', default = 'z', choices = {'x', 'y'}}}\n"
                                 "print(opt.mode)\n")
        r = self.tfhost("choice.lua")
        self.assertScriptError(r, "choice.lua:1: tf.options: the default of 'mode' must be one of x, y (got z)")


class ReplThroughPipe(TfhostTest):
    def repl(self, lines, *args):
        return self.tfhost(*args, "-i", stdin="".join(line + "\n" for line in lines))

    def test_expressions_and_statements(self):
        r = self.repl(["1 + 1", "x = 5", "x * 2", "1, 'a', nil", "-- just a comment"])
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "")
        self.assertEqual(r.stdout, "tf> 2\ntf> tf> 10\ntf> 1\ta\tnil\ntf> tf> \n")

    def test_tensor_value_prints(self):
        r = self.repl(["tf.zeros(2, 3)"], "--device", "cpu")  # the default is cuda:0 with a GPU
        self.assertExit(r, 0)
        self.assertIn("tensor([[0., 0., 0.],\n        [0., 0., 0.]], shape=(2, 3), dtype=f32, device=cpu)", r.stdout)

    def test_multiline_input_continues(self):
        r = self.repl(["for i = 1, 3 do", "print(i)", "end", "print('next')"])
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "")
        self.assertEqual(r.stdout, "tf> ... ... 1\n2\n3\ntf> next\ntf> \n")

    def test_multiline_function_definition(self):
        r = self.repl(["function add(a,", "  b)", "  return a + b", "end", "add(2, 3)"])
        self.assertExit(r, 0)
        self.assertIn("5\n", r.stdout)

    def test_error_is_reported_and_repl_goes_on(self):
        r = self.repl(["error('oops')", "x = = 1", "local t = tf.zeros(-1)", "print('after')"])
        self.assertExit(r, 0)
        self.assertIn("tfhost: stdin:1: oops\nstack traceback:", r.stderr)
        self.assertIn("tfhost: stdin:1: unexpected symbol near '='", r.stderr)
        self.assertIn("bad argument #1 to 'zeros' (negative size -1 for dimension 0)", r.stderr)
        self.assertIn("after\n", r.stdout)

    def test_exit_with_code(self):
        r = self.repl(["print('before')", "tf.exit(3)", "print('not reached')"])
        self.assertExit(r, 3)
        self.assertIn("before\n", r.stdout)
        self.assertNotIn("not reached", r.stdout)

    def test_end_of_input_exits_0(self):
        r = self.tfhost("-i", stdin="")
        self.assertExit(r, 0)
        self.assertEqual(r.stdout, "tf> \n")

    def test_incomplete_statement_at_end_of_input(self):
        r = self.repl(["for i = 1, 3 do"])
        self.assertExit(r, 0)
        self.assertIn("tfhost: stdin: incomplete statement at the end of input", r.stderr)

    def test_long_line(self):
        # A line longer than the old 4096-byte buffer was split into two
        # chunks, the first an unfinished string (repl.c).
        r = self.repl(['s = "' + "a" * 10000 + '"', "#s"])
        self.assertExit(r, 0)
        self.assertEqual(r.stderr, "")
        self.assertIn("tf> 10000\n", r.stdout)

    def test_script_then_repl(self):
        self.write("setup.lua", "answer = 41\n")
        r = self.tfhost("-i", "setup.lua", stdin="answer + 1\n")
        self.assertExit(r, 0)
        self.assertIn("tf> 42\n", r.stdout)

    # false elements of a bool tensor once printed as the "..." of a
    # summarised dimension.
    def test_bool_tensor_prints_false(self):
        r = self.repl(["tf.tensor({true, false})"], "--device", "cpu")
        self.assertExit(r, 0)
        self.assertRegex(r.stdout, r"tensor\(\[ ?true, false\], shape=\(2,\), dtype=bool, device=cpu\)")


class PtyRepl:
    """tfhost on a pseudo-terminal: reads with a deadline."""

    def __init__(self, test, args, env):
        self.test = test
        self.buf = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            try:
                os.execve(TFHOST, [TFHOST, *args], env)
            finally:
                os._exit(127)
        test.addCleanup(self.close)

    def expect(self, text, timeout=READ_TIMEOUT):
        """Reads until text appears; returns what came before it, text included."""
        pattern = text.encode()
        deadline = time.monotonic() + timeout
        while pattern not in self.buf:
            left = deadline - time.monotonic()
            ready = select.select([self.fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.test.fail(f"timed out waiting for {text!r}; got {self.buf!r}")
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                data = b""
            if not data:
                self.test.fail(f"end of output while waiting for {text!r}; got {self.buf!r}")
            self.buf += data
        end = self.buf.index(pattern) + len(pattern)
        seen, self.buf = self.buf[:end], self.buf[end:]
        return seen.decode(errors="replace")

    def send(self, text):
        os.write(self.fd, text.encode())

    def has_line_editor(self):
        """Whether the running tfhost was linked with libedit (or readline)."""
        with open(f"/proc/{self.pid}/maps") as maps:
            mapped = maps.read()
        return "libedit" in mapped or "libreadline" in mapped

    def send_eof(self, timeout=READ_TIMEOUT):
        """Sends Ctrl-D at the prompt. A line editor prints its prompt before
        it takes the terminal out of canonical mode, and a Ctrl-D typed in
        between is lost, so with a line editor this waits for that switch
        (no output tells when it happens)."""
        self.wait_editor(timeout)
        self.send("\x04")

    def wait_editor(self, timeout=READ_TIMEOUT):
        """Waits until a line editor has taken the terminal (keys such as Tab
        and Ctrl-D typed before that go to the terminal's own line mode)."""
        deadline = time.monotonic() + timeout
        while self.has_line_editor() and termios.tcgetattr(self.fd)[3] & termios.ICANON:
            if time.monotonic() > deadline:
                self.test.fail("the line editor never took the terminal")
            time.sleep(0.005)

    def wait(self, timeout=READ_TIMEOUT):
        """Reads to the end of output, then returns the exit code."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.test.fail(f"tfhost did not end; got {self.buf!r}")
            if not select.select([self.fd], [], [], left)[0]:
                continue
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                data = b""
            if not data:
                break
            self.buf += data
        while True:  # the pty is closed: the process is exiting
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                code = os.waitstatus_to_exitcode(status)
                self.test.check_sane(code, self.buf.decode(errors="replace"), "")
                return code
            if time.monotonic() > deadline:
                self.test.fail("tfhost closed its terminal but did not exit")
            time.sleep(0.01)

    def close(self):
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
        os.close(self.fd)


class ReplThroughTerminal(TfhostTest):
    def start(self, *args):
        return PtyRepl(self, args, self.env(TERM="dumb"))

    def test_banner_prompt_and_value(self):
        repl = self.start("--device", "cpu")  # the default is cuda:0 with a GPU
        banner = repl.expect("tf> ")
        self.assertRegex(banner, r"tfhost \S+ \(commit \S+\), Lua 5\.4")
        repl.send("1 + 1\r")
        self.assertRegex(repl.expect("tf> "), r"\r\n2\r\n")
        repl.send("tf.ones(2)\r")
        self.assertIn("tensor([1., 1.], shape=(2,), dtype=f32, device=cpu)", repl.expect("tf> "))
        has_editor = repl.has_line_editor()
        repl.send_eof()
        self.assertEqual(repl.wait(), 0)
        if has_editor:  # the line editor keeps the history in $HOME
            with open(os.path.join(self.home, ".tfhost_history")) as f:
                self.assertIn("tf.ones(2)", f.read())

    def test_tab_completes_names_and_help_answers(self):
        repl = self.start("--device", "cpu")
        repl.expect("tf> ")
        if not repl.has_line_editor():
            self.skipTest("this tfhost has no line editor: no completion")
        repl.send("x = tf.ones(2)\r")
        repl.expect("tf> ")
        repl.wait_editor()
        repl.send("tf.matm\t")        # one completion: the line is redrawn as tf.matmul
        repl.expect("tf.matmul")
        repl.send("(x, x:reshape(2, 1))\r")
        self.assertIn("tensor([2.]", repl.expect("device=cpu)"))
        repl.expect("tf> ")
        repl.wait_editor()
        repl.send("x:su\t\t")        # two: both are listed
        repl.expect("x:sub x:sum")
        repl.send("\x15help(tf.attention)\r")  # Ctrl-U clears the line first
        self.assertIn("scaled dot-product attention", repl.expect("naive"))
        repl.expect("tf> ")
        repl.send_eof()
        self.assertEqual(repl.wait(), 0)

    def test_ctrl_c_interrupts_the_chunk_not_the_repl(self):
        repl = self.start("-i")
        repl.expect("tf> ")
        repl.send("print('spinning') while true do end\r")
        repl.expect("spinning\r\n")  # printed from inside the running chunk
        repl.send("\x03")
        after = repl.expect("tf> ")
        self.assertRegex(after, r"tfhost: (stdin:1: )?interrupted!\r\nstack traceback:")
        repl.send("2 + 3\r")
        self.assertRegex(repl.expect("tf> "), r"\r\n5\r\n")
        # A second interruption, this time by a signal sent to the process.
        repl.send("print('again') while true do end\r")
        repl.expect("again\r\n")
        os.kill(repl.pid, signal.SIGINT)
        self.assertRegex(repl.expect("tf> "), r"tfhost: (stdin:1: )?interrupted!\r\n")
        repl.send("tf.exit(5)\r")
        self.assertEqual(repl.wait(), 5)

    def test_multiline_on_terminal(self):
        repl = self.start("-i")
        repl.expect("tf> ")
        repl.send("for i = 1, 2 do\r")
        repl.expect("... ")
        repl.send("print('line', i) end\r")
        out = repl.expect("tf> ")
        self.assertIn("line\t1\r\nline\t2\r\n", out)
        repl.send_eof()
        self.assertEqual(repl.wait(), 0)


class Interrupts(TfhostTest):
    @staticmethod
    def stop(p):
        if p.poll() is None:
            p.kill()
        p.communicate()

    def test_sigint_stops_a_script(self):
        self.write("spin.lua", "io.write('ready\\n') io.stdout:flush()\nwhile true do end\n")
        p = subprocess.Popen([TFHOST, "spin.lua"], cwd=self.tmp, env=self.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(self.stop, p)
        ready = select.select([p.stdout], [], [], READ_TIMEOUT)[0]
        self.assertTrue(ready, "the script never said it was ready")
        self.assertEqual(p.stdout.readline(), "ready\n")
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=READ_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail("SIGINT did not stop the script")
        self.check_sane(p.returncode, out, err)
        self.assertEqual(p.returncode, 1, err)
        # The hook raises where the script was stopped: in the loop, or in
        # the return from flush when the signal came that early.
        self.assertRegex(err, r"^tfhost: (spin\.lua:[12]: )?interrupted!\nstack traceback:\n")
        self.assertRegex(err, r"spin\.lua:[12]: in main chunk")


class LuaHeapLimit(TfhostTest):
    def heap_limit(self, value):
        env = self.env() if value is None else self.env(TFHOST_LUA_MEMORY=value)
        r = self.tfhost("-e", "print(tf.sysinfo().lua_heap_limit)", env=env)
        self.assertExit(r, 0)
        return int(r.stdout)

    def test_limit_from_environment(self):
        self.assertEqual(self.heap_limit("64M"), 64 << 20)
        self.assertEqual(self.heap_limit("2G"), 2 << 30)
        self.assertEqual(self.heap_limit("2048k"), 2048 << 10)  # the runtime alone needs over 512k

    def test_malformed_limit_falls_back_to_the_default(self):
        # NaN, inf and 1e30 used to be cast to size_t, which is undefined
        # (main.c); on x86 they gave a limit of 2^63 instead of the default.
        default = self.heap_limit(None)
        self.assertGreater(default, 0)
        for value in ("abc", "-5M", "12X", "nan", "inf", "1e30"):
            with self.subTest(value=value):
                self.assertEqual(self.heap_limit(value), default)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    if not os.access(TFHOST, os.X_OK):
        sys.exit(f"test_cli.py: {TFHOST} is not an executable")
    unittest.main()
