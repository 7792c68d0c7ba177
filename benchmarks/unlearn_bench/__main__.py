"""``python -m unlearn_bench``: the ``unlearn-bench`` command line."""

import sys

from .cli import main

sys.exit(main())
