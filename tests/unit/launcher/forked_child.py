"""Run by test_forked.py as ``python -m forked_child <exit code> [raise|wait]`` (a copy in its working directory), forked or fresh.

Prints what a process can see of itself as one JSON line, then exits with the code given, raises, or waits to
be signalled.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

if __name__ == "__main__":
    print(json.dumps({
        "pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv[1:],
        "marker": os.environ.get("FORKED_CHILD_MARKER"), "set_at_import": os.environ.get("SET_AT_IMPORT"), "draw": float(np.random.random()),
        "torch_loaded": "torch" in sys.modules, "comm": open("/proc/self/comm").read().strip(),
    }), flush=True)
    if sys.argv[2:] == ["raise"]:
        raise RuntimeError("planted failure")
    if sys.argv[2:] == ["wait"]:
        while True:
            time.sleep(1)
    sys.exit(int(sys.argv[1]))
