"""``python -m sessionlog``: the ``sessionlog`` command."""

import sys

from .cli import main

sys.exit(main())
