"""The use cases: run, submit, claim, work, recover, cancel, retry, resolve, kill, logs,
the lease and journal commands, and the task's supervisor.

``service`` is the facade the command line calls; the leader's use cases (``leader``,
``worker``, ``recoverer``) and the foreground run (``foreground``, ``launch``) are
given a ``session.Session`` (the state directory, the store, the leases, a reporter),
never the service, so nothing here calls back up. Use cases return values and never
render them.

May import ``ferry.core``, ``ferry.storage``, ``ferry.proc`` and ``ferry.failpoints``;
never ``ferry.cli``, and ``journal`` only through ``ferry.storage``.
"""
