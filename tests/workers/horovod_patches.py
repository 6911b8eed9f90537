"""Runs on each of 2 ranks: what hvdtrain's patches to Horovod change, measured in CPU time.

``python horovod_patches.py``. Prints ``REPORT {json}`` per rank with:

- ``idle_cpu_s``: this process's CPU time over 2 s in which the rank does nothing (only
  Horovod's background thread can use CPU then; patch 0002 lets it sleep);
- ``wait_cpu_s``: the CPU time of the main thread while it waits 2 s in ``synchronize``
  for a rank that joins the allreduce late (patch 0003 makes that wait block).
"""

import json
import time

import torch

import hvdtrain.adapters.torch as hvt

IDLE_S = 2.0


def main() -> None:
    hvt.init()
    hvt.allreduce(torch.zeros(1), name="warm_up")
    started = time.process_time()
    time.sleep(IDLE_S)
    idle_cpu_s = time.process_time() - started

    hvt.allreduce(torch.zeros(1), name="aligned")
    if hvt.rank() == 1:
        time.sleep(IDLE_S)
    started = time.thread_time()
    hvt.allreduce(torch.ones(4), name="late_join")
    wait_cpu_s = time.thread_time() - started
    print("REPORT " + json.dumps({"rank": hvt.rank(), "idle_cpu_s": idle_cpu_s,
                                  "wait_cpu_s": wait_cpu_s}), flush=True)
    hvt.shutdown()


if __name__ == "__main__":
    main()
