"""Whether the tfhost under test sees a CUDA device: the tests whose GPU parts skip, saying so, without one."""
import subprocess


def cuda_present(tfhost):
    r = subprocess.run([tfhost, "-e", "io.write(tostring(tf.cuda.is_available()))"], capture_output=True, text=True,
                       timeout=60)
    return r.stdout.strip() == "true"
