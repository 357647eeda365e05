#!/usr/bin/env python3
"""tfhost --nproc N: ranks started, their output relayed with the rank in
front, and a run that always ends: a rank's error or death stops every rank
with that rank's message and a non-zero exit, a collective that some ranks
never call is reported by a timeout naming them, Ctrl-C stops them all.

Run by ctest as `python3 tests/cli/test_dist.py /path/to/tfhost`. Every run
has a deadline, so a hang fails a test instead of blocking the suite.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

TFHOST = None
DEADLINE = 60  # seconds for any one run


def has_mpi():
    r = subprocess.run([TFHOST, "-e", "io.write(tostring(tf.dist.info().mpi_compiled))"],
                       capture_output=True, text=True, timeout=DEADLINE)
    return r.stdout.strip() == "true"


class DistLaunchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.env = dict(os.environ, TF_NUM_THREADS="1")
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID"):
            self.env.pop(name, None)

    def tearDown(self):
        self.dir.cleanup()

    def script(self, text):
        path = os.path.join(self.dir.name, "s.lua")
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def run_ranks(self, n, text, *args, env=None, timeout=DEADLINE):
        start = time.monotonic()
        r = subprocess.run([TFHOST, "--nproc", str(n), "--device", "cpu", self.script(text), *args],
                           capture_output=True, text=True, timeout=timeout, env=env or self.env)
        r.seconds = time.monotonic() - start
        return r

    def test_ranks_and_output_prefixes(self):
        r = self.run_ranks(3, """
            print("rank", tf.dist.rank(), "of", tf.dist.world_size(), "local", tf.dist.local_rank())
            io.stderr:write("note from " .. tf.dist.rank() .. "\\n")
            """)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("rank\t0\tof\t3\tlocal\t0", lines)  # rank 0's output as it is
        self.assertIn("[rank 1] rank\t1\tof\t3\tlocal\t1", lines)
        self.assertIn("[rank 2] rank\t2\tof\t3\tlocal\t2", lines)
        for k in range(3):
            self.assertIn(f"[rank {k}] note from {k}", r.stderr.splitlines())

    def test_arguments_reach_every_rank(self):
        r = self.run_ranks(2, "print(tf.dist.rank(), ...)", "a", "b c")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("0\ta\tb c", r.stdout.splitlines())
        self.assertIn("[rank 1] 1\ta\tb c", r.stdout.splitlines())

    def test_error_on_one_rank_ends_the_run(self):
        # rank 1 fails while rank 0 waits in a collective for it: no hang
        r = self.run_ranks(2, """
            if tf.dist.rank() == 1 then error("rank one gives up") end
            tf.dist.all_reduce(tf.ones(4))
            print("not reached")
            """)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("[rank 1] tfhost: ", r.stderr)
        self.assertIn("rank one gives up", r.stderr)
        self.assertIn("tfhost: rank 1 failed (exit code 1); every rank was stopped", r.stderr)
        self.assertNotIn("not reached", r.stdout)
        self.assertLess(r.seconds, 30)

    def test_rank_exit_code_is_the_runs(self):
        r = self.run_ranks(2, """
            if tf.dist.rank() == 1 then os.exit(7) end
            tf.dist.barrier()
            """)
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertIn("rank 1 failed (exit code 7)", r.stderr)

    def test_rank_killed_by_a_signal(self):
        r = self.run_ranks(2, """
            if tf.dist.rank() == 0 then os.execute("kill -9 " .. io.open("/proc/self/stat"):read("n")) end
            tf.dist.barrier()
            """)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("rank 0 failed", r.stderr)
        self.assertLess(r.seconds, 30)

    def test_collective_missing_on_some_ranks_times_out_naming_them(self):
        r = self.run_ranks(3, """
            tf.dist.set_timeout(2)
            if tf.dist.rank() ~= 2 then tf.dist.all_reduce(tf.ones(3)) end
            tf.dist.barrier()
            """)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("rank(s) 2 did not arrive within 2 s", r.stderr)
        self.assertLess(r.seconds, 30)

    def test_mismatched_shapes_name_the_ranks(self):
        r = self.run_ranks(2, """
            tf.dist.all_reduce(tf.ones(tf.dist.rank() == 0 and 8 or 6))
            """)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("the ranks disagree: rank 0 has all_reduce of 8 f32 on cpu, sum; rank 1 has all_reduce of 6 "
                      "f32 on cpu, sum", r.stderr)

    def test_ctrl_c_stops_every_rank(self):
        path = self.script("""
            print("started " .. tf.dist.rank()); io.stdout:flush()
            while true do tf.dist.barrier() end
            """)
        p = subprocess.Popen([TFHOST, "--nproc", "2", "--device", "cpu", path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=self.env, start_new_session=True)
        try:
            deadline = time.monotonic() + DEADLINE
            seen = ""
            while "started 0" not in seen and time.monotonic() < deadline:
                seen += p.stdout.readline()
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGINT)  # as the terminal does: the whole foreground group
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("tfhost: interrupted; every rank was stopped", err)

    def test_without_mpirun_ranks_start_but_cpu_tensors_say_why(self):
        env = dict(self.env, TFHOST_NO_MPIRUN="1")
        flag = os.path.join(self.dir.name, "rank0-printed")
        # rank 1 fails only once rank 0 has printed (a file says so): the launcher then stops rank 0
        r = self.run_ranks(2, """
            local flag = ...
            print("rank " .. tf.dist.rank() .. " of " .. tf.dist.world_size())
            io.stdout:flush()
            if tf.dist.rank() == 0 then
              io.open(flag, "w"):close()
              while true do end
            end
            while not io.open(flag) do end
            tf.dist.all_reduce(tf.ones(2))
            """, flag, env=env)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("rank 0 of 2", r.stdout)
        self.assertIn("[rank 1] rank 1 of 2", r.stdout)
        self.assertIn("CPU tensors travel between ranks through MPI", r.stderr)
        self.assertIn("rank 1 failed (exit code 1); every rank was stopped", r.stderr)

    def test_mpirun_tags_inside_a_line_are_dropped(self):
        # Open MPI tags each piece it reads from a rank, so a line that reached it in two pieces comes
        # as "[1,1]<stdout>:first[1,1]<stdout>:second"; a stand-in mpirun on PATH prints just that
        bindir = os.path.join(self.dir.name, "bin")
        os.mkdir(bindir)
        fake = os.path.join(bindir, "mpirun")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\n"
                    "printf '[1,0]<stdout>:0\\ta\\n[1,1]<stdout>:1[1,1]<stdout>:\\ta\\n'\n"
                    "printf '[1,1]<stderr>:note[1,1]<stderr>: from 1\\n' >&2\n")
        os.chmod(fake, 0o755)
        env = dict(self.env, PATH=bindir + os.pathsep + self.env.get("PATH", ""))
        r = self.run_ranks(2, "print(tf.dist.rank(), 'a')", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["0\ta", "[rank 1] 1\ta"])
        self.assertIn("[rank 1] note from 1", r.stderr.splitlines())

    def test_fork_mode_stops_the_others(self):
        env = dict(self.env, TFHOST_NO_MPIRUN="1")
        r = self.run_ranks(2, """
            if tf.dist.rank() == 1 then error("stop") end
            while true do end
            """, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("rank 1 failed (exit code 1)", r.stderr)
        self.assertLess(r.seconds, 30)

    def test_allreduce_experiment(self):
        out = os.path.join(self.dir.name, "ar.json")
        r = subprocess.run([TFHOST, "--nproc", "2", "--device", "cpu", "experiments/allreduce.lua", "--sizes", "1,2",
                            "--dtypes", "f32,bf16", "--iters", "2", "--warmup", "1", "--json", out,
                            "--plot", os.path.join(self.dir.name, "ar.html")],
                           capture_output=True, text=True, timeout=DEADLINE, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| f32 | 1 | 2 |", r.stdout)
        self.assertNotIn("[rank 1]", r.stdout)  # the table is rank 0's
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual(doc["key"], ["dtype", "size_mb", "world_size"])
        self.assertEqual(doc["env"]["dist"]["world_size"], 2)
        self.assertEqual([(row["dtype"], row["size_mb"]) for row in doc["results"]],
                         [("f32", 1), ("f32", 2), ("bf16", 1), ("bf16", 2)])
        for row in doc["results"]:
            self.assertGreater(row["busbw_gbs"], 0)
            self.assertAlmostEqual(row["busbw_gbs"], row["bytes"] / (row["time_ms"] / 1e3) / 1e9, places=6)

    def test_ddp_experiment(self):
        out = os.path.join(self.dir.name, "ddp.json")
        r = subprocess.run([TFHOST, "--nproc", "2", "--device", "cpu", "experiments/ddp.lua", "--context", "16",
                            "--batch", "1", "--steps", "2", "--warmup", "1", "--bucket_mb", "0.5,4", "--json", out],
                           capture_output=True, text=True, timeout=DEADLINE * 2, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            rows = json.load(f)["results"]
        self.assertEqual([(row["variant"], row.get("bucket_mb")) for row in rows],
                         [("none", None), ("per_param", None), ("flat", None), ("overlap", None), ("bucket", 0.5),
                          ("bucket", 4), ("zero1", 0.5), ("zero1", 4)])
        by = {(row["variant"], row.get("bucket_mb")): row for row in rows}
        # ZeRO-1 holds half of AdamW's state on each of 2 ranks
        self.assertAlmostEqual(by[("zero1", 4)]["optimizer_mib"], by[("flat", None)]["optimizer_mib"] / 2, places=2)
        for row in rows:
            self.assertGreater(row["step_ms"], 0)
            if row["variant"] != "none":
                self.assertIn("exposed_ms", row)
                self.assertGreaterEqual(row["hidden_pct"], 0)
                self.assertLessEqual(row["hidden_pct"], 100)

    def test_bad_nproc(self):
        for bad in ("0", "x", "-1", "1000"):
            r = subprocess.run([TFHOST, "--nproc", bad, "-e", "print(1)"], capture_output=True, text=True,
                               timeout=DEADLINE)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--nproc needs a count", r.stderr)

    def test_environment_conventions(self):
        def world(**env):
            e = dict(self.env, **env)
            r = subprocess.run([TFHOST, "-e", "local i = tf.dist.info() io.write(i.rank, ' ', i.world_size, ' ', "
                                "i.local_rank, ' ', i.launcher)"], capture_output=True, text=True, env=e,
                               timeout=DEADLINE)
            return r.returncode, r.stdout + r.stderr
        self.assertEqual(world(), (0, "0 1 0 none"))
        self.assertEqual(world(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"), (0, "0 1 0 torchrun"))
        self.assertEqual(world(SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="1", SLURM_LOCALID="0"), (0, "0 1 0 srun"))
        code, text = world(RANK="3", WORLD_SIZE="2")
        self.assertNotEqual(code, 0)
        self.assertIn("RANK=3 is not below WORLD_SIZE=2", text)
        code, text = world(RANK="x", WORLD_SIZE="2")
        self.assertNotEqual(code, 0)
        self.assertIn("RANK='x' is not an integer", text)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_dist.py /path/to/tfhost [unittest options]")
    TFHOST = os.path.abspath(sys.argv.pop(1))
    if not has_mpi():
        print("skipped: this tfhost was built without MPI (install libopenmpi-dev)")
        sys.exit(77)
    unittest.main()
