"""ferry: a crash-safe task runner.

See docs/architecture.md for the map of the package.
"""

__version__ = "0.1.0"
