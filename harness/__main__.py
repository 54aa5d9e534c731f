"""``python -m harness``: the same as the ``attn-harness`` command."""

import sys

from harness.cli.main import main

sys.exit(main())
