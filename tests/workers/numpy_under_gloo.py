"""Calls hvn.init() under whatever launcher started it; prints the error it raises.

``numpy_under_gloo.py DIR``: after printing, each rank leaves a mark in DIR and exits
only once every rank has printed, so horovodrun, which stops the others as soon as one
fails, cannot cut a slower rank off before its error is on record.
"""

import sys
import time
from pathlib import Path

import hvdtrain.adapters.numpy as hvn
from hvdtrain.runtime import launcher_rank, launcher_size

try:
    hvn.init()
    print("initialised: size", hvn.size())
except RuntimeError as error:
    print("REPORT-ERROR", error, flush=True)
    marks = Path(sys.argv[1])
    (marks / f"printed-{launcher_rank()}").touch()
    deadline = time.monotonic() + 60
    while len(list(marks.glob("printed-*"))) < launcher_size() and time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit(3) from None
