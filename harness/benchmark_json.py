"""``python -m harness.benchmark_json BENCH.json OUT.json``: kept for scripts that use this name.

The converter is ``harness.results.pytest_benchmark``.
"""

import sys

from harness.results.pytest_benchmark import main

if __name__ == "__main__":
    sys.exit(main())
