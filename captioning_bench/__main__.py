"""``python -m captioning_bench <name> ...``: the same as the ``captioning-bench`` console script."""

import sys

from captioning_bench.cli import main

sys.exit(main())
