"""``python3 -m harness.gpu_check OUT_DIR``: the GPU script under the name its runbooks use.

The script is ``harness.gpu`` (``python3 -m harness.gpu OUT_DIR``).
"""

import sys

from harness.gpu.check import main

if __name__ == "__main__":
    sys.exit(main())
