"""``ferry`` on a host whose wall clock is off by ``$FERRY_TEST_SKEW_S`` seconds (NTP not
synced yet, a VM resumed): ``time.time()`` and ``time.time_ns()`` shifted, as a wrong
wall clock is; the monotonic and boot clocks as they are. Run as a script:
``python skewed_ferry.py ARGS...`` is ``ferry ARGS...`` on that host."""

from __future__ import annotations

import os
import runpy
import sys
import time

_skew_s = float(os.environ.get("FERRY_TEST_SKEW_S", "0"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _skew_s
time.time_ns = lambda: _time_ns() + int(_skew_s * 1e9)
sys.argv = ["ferry", *sys.argv[1:]]
runpy.run_module("ferry.cli", run_name="__main__")
