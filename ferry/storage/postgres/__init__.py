"""The shared backend: the seam's protocols (``ferry.storage``) on a PostgreSQL
database, so that one queue serves many hosts (``--database URL``).

``connect`` (a connection, its errors mapped to ferry's codes, durability checked),
``schema`` (versioned migrations, ``db init`` and ``db status``), ``store`` (events and
the table of tasks, every write validated by ``ferry.core.fold`` against the rows it
locked in the transaction that writes), ``lease`` (one lease per host, epochs from a
sequence, times from the database's clock).

May import ``psycopg``, ``ferry.core``, ``ferry.proc`` and ``ferry.storage``; never
``ferry.app`` or ``ferry.cli``. Only imported when a database is named: the default
install runs without psycopg.
"""
