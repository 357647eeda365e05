"""test_experiment_defaults.py's test for the experiments that train the Transformer LM
(benchmark, memory_profile, mixed_precision, overhead, ddp, train): each at its CPU defaults, quickly.

    python3 tests/cli/test_experiment_defaults_models.py /path/to/tfhost
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_experiment_defaults  # noqa: E402


class ModelCpuDefaults(test_experiment_defaults.CpuDefaults):
    MODELS = True


if __name__ == "__main__":
    test_experiment_defaults.TFHOST = os.path.abspath(sys.argv.pop(1))
    unittest.main(defaultTest="ModelCpuDefaults")
