"""Processes, on one host: spawning a child in its own session, supervising it
(capture, passthrough, signals, timeouts, heartbeats), process identities that survive
pid reuse, liveness probes with proof, the alive-lock a task's processes inherit, and
the control channel between a launcher and a supervisor.

May import ``ferry.core`` and ``ferry.failpoints``; never ``ferry.storage``,
``ferry.app`` or ``ferry.cli``. Nothing here knows about the journal.
"""
