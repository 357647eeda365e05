"""experiments/train.lua's checkpoints from the outside, as a user's runs meet them:
  - a run stopped by Ctrl-C saves a checkpoint and exits 130, and --resume from it ends with the
    same parameters (every tensor's checksum) and the same validation losses as a run never stopped;
  - SIGKILL at random moments, 20 trials, half of them while a checkpoint is being written: the
    newest checkpoint of the folder always restores, and resuming from it reaches the same final
    bits; a file being written is never listed as a checkpoint;
  - a full disk during a save is a clear error, and the previous checkpoint stays whole (a small
    tmpfs where this machine allows one, else a file-size limit, said which).

    python3 tests/cli/test_train_kill.py /path/to/tfhost
"""
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFHOST = None
STEPS = 24
# A model whose checkpoint (about 17 MB with its moments) takes longer to write than a step takes to run,
# so that kills often land inside a save.
MODEL = ["--preset", "tiny", "--d_model", "256", "--num_heads", "4", "--d_ff", "512", "--num_layers", "2",
         "--context", "16", "--batch", "2", "--precision", "f32"]
RUN = MODEL + ["--steps", str(STEPS), "--eval_every", "8", "--eval_tokens", "256", "--checkpoint_every", "2",
               "--keep", "2", "--log_every", "4", "--lr", "3e-3", "--seed", "5"]


def make_data(folder):
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(1)
    for name, n in (("train.bin", 20000), ("val.bin", 4000)):
        text = bytes(rng.choice(b"abcdefgh \n") for _ in range(n))
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"".join(bytes([c, 0]) for c in text))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"vocab_size": 256, "dtype": "u16"}, f)


def train(cwd, out, *extra, timeout=300, **kw):
    return subprocess.run([TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", "train.lua"), "--data", "data",
                           "--out", out, *RUN, *extra], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


def start(cwd, out, *extra):
    return subprocess.Popen([TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", "train.lua"), "--data",
                             "data", "--out", out, *RUN, *extra], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def checkpoints(folder):
    """The whole checkpoints tfhost lists in a folder (tf.checkpoint.folder:list), by step."""
    script = (f"for _, c in ipairs(tf.checkpoint.folder({json.dumps(folder)}):list()) do "
              "print(c.step, c.path) end")
    r = subprocess.run([TFHOST, "--device", "cpu", "-e", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [(int(line.split("\t")[0]), line.split("\t")[1]) for line in r.stdout.splitlines()]


def fingerprint(path):
    """Every tensor's checksum and the step of a checkpoint (the parameters' and moments' bits)."""
    script = (f"local h = tf.safetensors.read_header({json.dumps(path)}) "
              f"local names = {{}} for n in pairs(h) do names[#names + 1] = n end table.sort(names) "
              "for _, n in ipairs(names) do print(n, h[n].xxh64) end "
              f"print('step', tf.checkpoint.info({json.dumps(path)}).step)")
    r = subprocess.run([TFHOST, "--device", "cpu", "-e", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def val_losses(results):
    with open(results) as f:
        return [(row["step"], row["val_loss"], row["train_loss"]) for row in json.load(f)["results"]]


class TrainRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tf_train_kill_")
        make_data(os.path.join(cls.tmp, "data"))
        r = train(cls.tmp, "ref")
        assert r.returncode == 0, r.stderr[-3000:]
        cls.final = os.path.join(cls.tmp, "ref", "checkpoints", f"step_{STEPS:08d}.safetensors")
        cls.reference = fingerprint(cls.final)
        cls.losses = val_losses(os.path.join(cls.tmp, "ref", "results.json"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def resume_to_end(self, out):
        r = train(self.tmp, out, "--resume", out)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("resumed from", r.stderr)
        return os.path.join(self.tmp, out, "checkpoints", f"step_{STEPS:08d}.safetensors")

    def test_ctrl_c_saves_and_resumes_to_the_same_bits(self):
        out = "ctrl_c"
        p = start(self.tmp, out)
        log = os.path.join(self.tmp, out, "log.txt")
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(log):
                with open(log) as f:
                    if "step 8/" in f.read():
                        break
            time.sleep(0.02)
        self.assertIsNone(p.poll(), "the run ended before Ctrl-C")
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 130, stderr[-2000:])
        self.assertRegex(stderr, r"checkpoint .*step_\d{8}\.safetensors .*\(interrupted\)")
        with open(os.path.join(self.tmp, out, "results.json")) as f:
            self.assertIs(json.load(f)["complete"], False)
        listed = checkpoints(os.path.join(self.tmp, out, "checkpoints"))
        self.assertTrue(listed and listed[-1][0] < STEPS, listed)
        final = self.resume_to_end(out)
        self.assertEqual(fingerprint(final), self.reference)
        self.assertEqual(val_losses(os.path.join(self.tmp, out, "results.json")), self.losses)

    def test_sigkill_at_random_moments(self):
        rng = random.Random(20261202)
        during_write, before_any = 0, 0
        for trial in range(20):
            with self.subTest(trial=trial):
                out = f"kill{trial}"
                folder = os.path.join(self.tmp, out, "checkpoints")
                p = start(self.tmp, out)
                if trial % 2 == 0:  # as soon as a save is under way (its temporary file exists)
                    deadline = time.time() + 60
                    wait_for = rng.randint(1, 6)  # the n-th save
                    seen = set()
                    while time.time() < deadline and p.poll() is None:
                        names = os.listdir(folder) if os.path.isdir(folder) else []
                        seen.update(n for n in names if ".tmp-" in n)
                        if len(seen) >= wait_for:
                            break
                        time.sleep(0.0005)
                else:
                    time.sleep(rng.uniform(0.05, 2.0))
                p.kill()
                p.communicate(timeout=60)
                if p.returncode == 0:
                    continue  # it finished first: nothing was killed
                names = os.listdir(folder) if os.path.isdir(folder) else []
                if any(".tmp-" in n for n in names):
                    during_write += 1
                listed = checkpoints(folder) if os.path.isdir(folder) else []
                for _, path in listed:
                    self.assertNotIn(".tmp-", path)
                if not listed:
                    before_any += 1
                    shutil.rmtree(os.path.join(self.tmp, out), ignore_errors=True)  # killed before it made one
                    r = train(self.tmp, out)  # nothing to resume: a fresh run
                    self.assertEqual(r.returncode, 0, r.stderr[-2000:])
                    final = os.path.join(self.tmp, out, "checkpoints", f"step_{STEPS:08d}.safetensors")
                else:
                    final = self.resume_to_end(out)
                self.assertEqual(fingerprint(final), self.reference, f"trial {trial}")
                self.assertEqual(val_losses(os.path.join(self.tmp, out, "results.json")), self.losses)
                self.assertFalse([n for n in os.listdir(folder) if ".tmp-" in n], "stale temporary files removed")
                shutil.rmtree(os.path.join(self.tmp, out))
        print(f"SIGKILL: {during_write} of 20 trials killed a save part way, {before_any} before the first "
              "checkpoint", file=sys.stderr)
        self.assertGreaterEqual(during_write, 5, "the trials must include kills during a checkpoint write")

    def test_full_disk_keeps_the_previous_checkpoint(self):
        out = os.path.join(self.tmp, "disk")
        r = train(self.tmp, out, "--steps", "4", "--checkpoint_every", "2")
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        before = checkpoints(os.path.join(out, "checkpoints"))
        self.assertEqual([s for s, _ in before], [2, 4])
        size = os.path.getsize(before[-1][1])
        run = [TFHOST, "--device", "cpu", os.path.join(ROOT, "experiments", "train.lua"), "--data", "data", *RUN,
               "--steps", "8", "--keep", "3"]
        report = os.path.join(self.tmp, "disk_report.txt")
        err = os.path.join(self.tmp, "disk_err.txt")

        def check_script(folder):
            """tfhost lines: each listed checkpoint's step and fingerprint, and stray temporary files."""
            return (f"for _, c in ipairs(tf.checkpoint.folder({json.dumps(folder)}):list()) do "
                    "local h = tf.safetensors.read_header(c.path) local names = {} "
                    "for n in pairs(h) do names[#names + 1] = n end table.sort(names) "
                    "local sums = {} for _, n in ipairs(names) do sums[#sums + 1] = h[n].xxh64 end "
                    "print(c.step, tf.checkpoint.info(c.path).step, table.concat(sums, ',')) end "
                    f"for _, p in ipairs(tf.data.files({json.dumps(folder)})) do "
                    "if p:find('.tmp-', 1, true) then print('stray', p) end end")

        # The disk: a tmpfs holding what the run had and half a checkpoint more, in a mount namespace of its own
        fs = os.path.join(self.tmp, "fs")
        os.makedirs(fs, exist_ok=True)
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {fs}"],
                               capture_output=True, text=True)
        q = subprocess.list2cmdline
        if probe.returncode == 0:
            how, expected = "a full tmpfs", "No space left on device"
            used = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs_ in os.walk(out) for f in fs_)
            script = (f"mount -t tmpfs -o size={used + size // 2} tmpfs {fs} && cp -a {out}/. {fs}/ && "
                      f"{{ {q(run + ['--out', fs, '--resume', fs])} 2> {err}; echo rc $? > {report}; }} && "
                      f"{q([TFHOST, '--device', 'cpu', '-e', check_script(fs + '/checkpoints')])} >> {report}")
            subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=self.tmp, timeout=300)
        else:
            how, expected = "a file-size limit (no tmpfs here: " + probe.stderr.strip() + ")", "File too large"

            def limit():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
            with open(err, "w") as e:
                r = subprocess.run(run + ["--out", out, "--resume", out], cwd=self.tmp, stderr=e, preexec_fn=limit,
                                   timeout=300)
            c = subprocess.run([TFHOST, "--device", "cpu", "-e", check_script(out + "/checkpoints")],
                               capture_output=True, text=True, timeout=60)
            with open(report, "w") as f:
                f.write(f"rc {r.returncode}\n" + c.stdout)
        print(f"full disk: {how}", file=sys.stderr)
        with open(err) as f:
            stderr = f.read()
        with open(report) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "rc 1", stderr[-2000:])
        self.assertIn("tf.safetensors.save", stderr)
        self.assertIn(expected, stderr)
        self.assertRegex(stderr, r"step_00000006\.safetensors")
        # the checkpoints written before are whole (every checksum as before) and no temporary file is left
        want = []
        for step, path in before:
            sums = [line.split("\t")[1] for line in fingerprint(path).splitlines() if not line.startswith("step")]
            want.append(f"{step}\t{step}\t{','.join(sums)}")
        self.assertEqual(lines[1:], want)


if __name__ == "__main__":
    TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main()
