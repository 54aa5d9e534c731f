"""``python -m harness.gpu OUT_DIR``: the GPU script."""

import sys

from harness.gpu.check import main

sys.exit(main())
