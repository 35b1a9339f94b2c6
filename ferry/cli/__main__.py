"""``python -m ferry.cli``: the ``ferry`` command."""

import sys

from ferry.cli import main

sys.exit(main())
