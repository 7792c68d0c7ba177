"""``python -m hf_unlearn.cli``: the ``hf-unlearn`` command."""

import sys

from . import main

sys.exit(main())
