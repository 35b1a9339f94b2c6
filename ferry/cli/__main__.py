"""``python -m ferry.cli``: the ``ferry`` command."""

from ferry.cli import console

console()
