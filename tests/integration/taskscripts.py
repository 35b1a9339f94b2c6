"""Python task scripts shared by the supervise and run tests (``python -c SCRIPT``)."""

# Handles SIGINT/SIGTERM/SIGHUP by writing the signal number to argv[1], then exits 0.
# Writes its pid to argv[2] once the handlers are in place.
TREE_LEAF = r"""
import os, signal, sys, time
marker, ready = sys.argv[1], sys.argv[2]
def on(sig, frame):
    with open(marker, "w") as f:
        f.write(str(sig))
    os._exit(0)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, on)
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
while True:
    time.sleep(60)
"""
