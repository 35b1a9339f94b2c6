"""The local backend: the seam's protocols (``ferry.storage``) over ``journal/`` in one
state directory. ``store`` (events folded into the table, snapshots, archives,
compaction, the epoch fence), ``lease`` (``lease.json``, compare-and-swap), ``statedir``
(finding and securing the directory), ``maintenance`` (``journal verify/repair/dump``,
which must answer when the store cannot open).

May import ``journal``, ``ferry.core``, ``ferry.proc`` and ``ferry.failpoints``.
"""
