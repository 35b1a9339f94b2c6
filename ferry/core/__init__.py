"""The pure core: what a task is and how its events change it, with no I/O.

Lives here: the model (states, reasons, ``Task``), ``TaskSpec``, ids and claim tokens,
the events and their decoding, the fold (one event applied to one task, and the write
rule every backend enforces), the table of tasks, the recovery matrix
(``recovery.decide``), the patch and pinning decisions, and ``FerryError`` with its
codes. May import only ``ferry.core`` and the standard library's pure parts (no os,
files, time, randomness or processes: callers pass clocks and random bytes in), plus
``journal._json`` (JSON, any layer may import it). Everything else in ferry may import it.
"""
