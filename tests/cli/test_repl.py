#!/usr/bin/env python3
"""The REPL on a pseudo-terminal: Ctrl-C at the prompt, at a continuation
line and inside a running chunk keeps tfhost and its variables; only Ctrl-D
leaves. Every case runs with the line editor (when this tfhost has one) and
with plain line reading (TFHOST_NO_EDITLINE=1). Also Tab completion of a
tensor's fields, how the REPL prints tables, and the banner's backend line.

Run by ctest as `python3 tests/cli/test_repl.py /path/to/tfhost`; it uses
test_cli.py's helpers (tfhost in a scratch directory, reads with deadlines).
"""
import os
import select
import sys
import time
import unittest

import test_cli as cli


class PlainPtyRepl(cli.PtyRepl):
    """tfhost reading plain lines on its terminal: the terminal stays in its
    own line mode, so nothing waits for a line editor."""

    def has_line_editor(self):
        return False


class CtrlC(cli.TfhostTest):
    def each_mode(self, body):
        """Runs body(repl) on a fresh REPL, at its first prompt, once per way
        of reading lines."""
        for plain in (False, True):
            with self.subTest(plain=plain):
                env = self.env(TERM="dumb", TFHOST_NO_EDITLINE="1" if plain else "0")
                repl = (PlainPtyRepl if plain else cli.PtyRepl)(self, ("--device", "cpu"), env)
                repl.expect("tf> ")
                if not plain and not repl.has_line_editor():
                    self.skipTest("this tfhost has no line editor (the plain case covers the terminal)")
                body(repl)

    def send_line(self, repl, text, prompt="tf> "):
        repl.wait_editor()
        repl.send(text + "\r")
        return repl.expect(prompt)

    def interrupt_prompt(self, repl):
        """Ctrl-C at a prompt, then waits for the next "tf> ". A Ctrl-C that
        lands between the prompt's output and the read that waits for the
        line is only noted, so it is sent again if no prompt comes (one more
        at a fresh prompt only gives one more prompt)."""
        repl.wait_editor()
        for _ in range(20):
            repl.send("\x03")
            deadline = time.monotonic() + 0.5
            while b"tf> " not in repl.buf and time.monotonic() < deadline:
                if select.select([repl.fd], [], [], 0.05)[0]:
                    repl.buf += os.read(repl.fd, 4096)
            if b"tf> " in repl.buf:
                return repl.expect("tf> ")
        self.fail(f"no new prompt after Ctrl-C; got {repl.buf!r}")

    def value(self, repl, expression):
        """What expression prints as, found by a marker that its echo does
        not hold (so a stray extra prompt cannot be mistaken for it)."""
        repl.wait_editor()
        repl.send(f"print('va' .. 'lue=' .. tostring({expression}))\r")
        repl.expect("value=")
        return repl.expect("\r\n")[:-2]

    def leave(self, repl):
        repl.send_eof()
        self.assertEqual(repl.wait(), 0)

    def test_ctrl_c_at_the_prompt_drops_the_line_and_keeps_state(self):
        self.each_mode(self.check_prompt)

    def check_prompt(self, repl):
        self.send_line(repl, "a = 1")
        self.interrupt_prompt(repl)                # an empty line
        repl.wait_editor()
        repl.send("a = 99")                        # typed, not entered
        self.interrupt_prompt(repl)
        self.assertEqual(self.value(repl, "a"), "1")
        self.leave(repl)

    def test_ctrl_c_at_a_continuation_line_drops_the_pending_statement(self):
        self.each_mode(self.check_continuation)

    def check_continuation(self, repl):
        self.send_line(repl, "a = 1")
        self.send_line(repl, "for i = 1, 3 do", prompt="... ")
        self.send_line(repl, "a = a + 10", prompt="... ")
        self.interrupt_prompt(repl)
        self.assertEqual(self.value(repl, "a"), "1")
        # the next statement starts afresh: no "end" is still owed
        self.assertEqual(self.value(repl, "a + 1"), "2")
        self.leave(repl)

    def test_ctrl_c_in_a_long_loop_interrupts_the_chunk_only(self):
        self.each_mode(self.check_loop)

    def check_loop(self, repl):
        self.send_line(repl, "a = 1")
        repl.wait_editor()
        repl.send("b = 2 print('spinning') while true do end\r")
        repl.expect("spinning\r\n")                # the chunk runs
        repl.send("\x03")
        self.assertRegex(repl.expect("tf> "), r"tfhost: (stdin:1: )?interrupted!")
        self.assertEqual(self.value(repl, "a + b"), "3")
        self.interrupt_prompt(repl)                # and the prompt still survives one
        self.assertEqual(self.value(repl, "a + b"), "3")
        self.leave(repl)


    def test_ctrl_c_keeps_the_timeout_of_the_next_chunk(self):
        # --timeout's clock is a count hook; Ctrl-C's hook replaced it, so the chunks after an
        # interrupted one ran untimed. The next endless chunk must still be stopped.
        env = self.env(TERM="dumb", TFHOST_NO_EDITLINE="1")
        repl = PlainPtyRepl(self, ("--device", "cpu", "--safe", "--timeout", "3"), env)
        repl.expect("tf> ")
        repl.send("print('spin' .. 'ning') while true do end\r")
        repl.expect("spinning\r\n")
        repl.send("\x03")
        self.assertRegex(repl.expect("tf> "), r"interrupted!")
        repl.send("while true do end\r")
        repl.expect("stopped after 3 s of wall-clock time", timeout=30)
        self.assertEqual(repl.wait(), 124)
        # stopped by the hook in Lua, not by the clock's last resort after its grace period
        self.assertNotIn(b"ended at once", repl.buf)


class HelpCompletionAndPrinting(cli.TfhostTest):
    def test_tab_completes_a_tensors_fields(self):
        repl = cli.PtyRepl(self, ("--device", "cpu"), self.env(TERM="dumb"))
        repl.expect("tf> ")
        if not repl.has_line_editor():
            self.skipTest("this tfhost has no line editor: no completion")
        repl.send("w = tf.ones(2):requires_grad(true)\r")
        repl.expect("tf> ")
        repl.wait_editor()
        repl.send("w.gr\t\t")                  # two completions: both are listed
        self.assertRegex(repl.expect("w.grad_fn"), r"\nw\.grad +w\.grad_fn$")
        repl.send("\x15w.sha\t")               # Ctrl-U, then one: the line becomes w.shape
        repl.expect("w.shape")
        repl.send("\r")
        self.assertIn("(2,)", repl.expect("tf> "))
        repl.send_eof()
        self.assertEqual(repl.wait(), 0)

    def test_tables_print_as_lua_tables_and_help_finds_methods(self):
        r = self.tfhost("-i", "--device", "cpu",
                        stdin="tf.mem.stats()\n{1, 'a', {b = true}}\nx = tf.ones(2)\nhelp(x.sum)\n")
        self.assertExit(r, 0)
        self.assertNotIn("table: 0x", r.stdout)
        self.assertRegex(r.stdout, r"tf> \{\n  active_blocks = \d+,\n  allocated = \d+,\n")
        self.assertIn('{ 1, "a", { b = true } }', r.stdout)
        self.assertIn("tf.sum(x [, dim [, keepdim]])", r.stdout)
        self.assertIn("also a tensor method: x:sum(", r.stdout)


class Banner(cli.TfhostTest):
    def banner(self, env):
        r = self.tfhost("-v", "-e", "io.write(tostring(tf.cuda.compiled()), ' ', tf.cuda.device_count())", env=env)
        self.assertExit(r, 0)
        first, facts = r.stdout.split("\n", 1)
        compiled, gpus = facts.split()
        return first, compiled == "true", int(gpus)

    def test_the_banner_says_which_backend_runs(self):
        for env in (self.env(), self.env(CUDA_VISIBLE_DEVICES="")):  # the second hides every GPU
            with self.subTest(hidden=env.get("CUDA_VISIBLE_DEVICES") == ""):
                first, compiled, gpus = self.banner(env)
                if not compiled:
                    self.assertTrue(first.endswith(", CPU backend only (built without CUDA)"), first)
                elif gpus == 0:
                    self.assertTrue(first.endswith(", CUDA backend built, no GPU found"), first)
                else:
                    self.assertTrue(first.endswith(", CUDA backend"), first)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_repl.py /path/to/tfhost [unittest options]")
    cli.TFHOST = os.path.abspath(sys.argv.pop(1))
    if not os.access(cli.TFHOST, os.X_OK):
        sys.exit(f"test_repl.py: {cli.TFHOST} is not an executable")
    unittest.main()
