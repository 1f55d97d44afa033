"""``python -m benchmarks`` (from the repository root) and ``python -m sessionlog.bench``."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
