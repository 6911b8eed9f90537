"""NumPy-adapter training on 2 MPI ranks where rank 1 stops joining at step 3:
``python numpy_skip.py``.

Rank 0, left waiting in the gradient Allreduce, must end itself after
``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` naming the step and rank 1 (mpi4py releases
the GIL while it waits, so the watchdog thread runs). Prints ``REPORT {json}`` with
the rank's pid when it starts.
"""

import json
import os
import time

from numpy_common import gradients, make_data, make_weights, rows

import hvdtrain.adapters.numpy as hvn

hvn.init()
print("REPORT " + json.dumps({"rank": hvn.rank(), "event": "started", "pid": os.getpid()}),
      flush=True)
x, y = make_data()
weights = make_weights()
optimizer = hvn.DistributedSGD(weights, lr=0.1)
for step in range(20):
    if hvn.rank() == 1 and step == 3:
        time.sleep(600)
    batch = rows(step, hvn.rank())
    optimizer.step(gradients(weights, x[batch], y[batch]))
