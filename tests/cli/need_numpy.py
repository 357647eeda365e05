"""numpy for the tests that read tfhost's files with it: imported, or the test skips (exit 77), saying how to
install it. A test imports it as

    from need_numpy import np
"""
import sys

try:
    import numpy as np  # noqa: F401
except ImportError as e:
    print(f"SKIP: numpy is needed ({e}); install it with: pip install --user numpy")
    sys.exit(77)
