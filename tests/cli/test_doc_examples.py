#!/usr/bin/env python3
"""Every Lua example of README.md and docs/ runs: on the CPU where there is no GPU, on the default
device (the GPU) where there is one.

    python3 tests/cli/test_doc_examples.py path/to/tfhost

Each ```lua block runs in a fresh tfhost (in a scratch directory, 120 s at most) and must exit 0. A block may be preceded by an HTML comment that the rendered page does not show:
  <!-- doc-test setup: LUA -->   Lua run before the block (the names a fragment assumes)
  <!-- doc-test: needs cuda -->  the block runs only where a GPU is present
A block that fails is reported with its file and line and what tfhost printed."""

import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_present import cuda_present  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
TFHOST = None
BLOCK = re.compile(r"^```lua\n(.*?)^```", re.S | re.M)
DIRECTIVE = re.compile(r"<!-- doc-test(?: (setup)|): (.*?) -->", re.S)


def blocks():
    """(file, line, code, setup, needs_cuda) for every Lua block of the docs."""
    for name in DOCS:
        path = os.path.join(ROOT, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n\n", 1)[-1]  # the paragraph just above
            setup, needs_cuda = "", False
            for d in DIRECTIVE.finditer(before):
                if d.group(1):
                    setup += d.group(2) + "\n"
                elif d.group(2).strip() == "needs cuda":
                    needs_cuda = True
            yield name, line, m.group(1), setup, needs_cuda


class DocExamples(unittest.TestCase):
    def test_every_example_runs(self):
        gpu = cuda_present(TFHOST)
        found = list(blocks())
        self.assertGreater(len(found), 20, "the docs' Lua examples were not found")
        ran = skipped = 0
        failures = []
        for name, line, code, setup, needs_cuda in found:
            if needs_cuda and not gpu:
                skipped += 1
                continue
            device = "cuda" if gpu else "cpu"
            with tempfile.TemporaryDirectory() as tmp:
                script = os.path.join(tmp, "example.lua")
                with open(script, "w") as f:
                    f.write(setup + code)
                try:
                    r = subprocess.run([TFHOST, "--device", device, script], capture_output=True, text=True,
                                       cwd=tmp, timeout=120)
                    rc, out = r.returncode, (r.stdout + r.stderr)[-1500:]
                except subprocess.TimeoutExpired:
                    rc, out = "timeout (120 s)", ""
            ran += 1
            if rc != 0:
                failures.append(f"{name}:{line}: exit {rc}\n{out}")
        print(f"doc examples: {ran} ran on the {'GPU' if gpu else 'CPU'}"
              + (f", {skipped} skipped: they need a GPU" if skipped else ""), file=sys.stderr)
        self.assertEqual(failures, [], "\n\n".join(failures))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_doc_examples.py path/to/tfhost")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
