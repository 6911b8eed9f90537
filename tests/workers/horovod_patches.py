"""Runs on each of 2 ranks: what hvdtrain's patches to Horovod change, measured in CPU time.

``python horovod_patches.py``. Prints ``REPORT {json}`` per rank with:

- ``idle_cpu_s``: this process's CPU time over 2 s in which the rank does nothing (only
  Horovod's background thread can use CPU then; patch 0002 lets it sleep);
- ``wait_cpu_s``: the CPU time of the main thread while it waits 2 s in ``synchronize``
  for a rank that joins the allreduce late (patch 0003 makes that wait block);
- ``connections_after_shutdown``: this process's established TCP connections after
  ``shutdown()`` (under Gloo, to the other ranks; patch 0009 closes them);
- ``native_threads_after_shutdown``: threads started since before ``init()`` that are
  still running after ``shutdown()``, Python's own (hvdtrain's watchdog) left out.
"""

import json
import os
import threading
import time
from pathlib import Path

import torch

import hvdtrain.adapters.torch as hvt

IDLE_S = 2.0


def threads() -> set[int]:
    """The ids of this process's threads."""
    return {int(task) for task in os.listdir("/proc/self/task")}


def established_tcp_connections() -> int:
    """How many of this process's sockets are established TCP connections."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            count += fields[3] == "01" and fields[9] in inodes  # 01: ESTABLISHED
    return count


def main() -> None:
    before_init = threads()
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
    rank = hvt.rank()
    hvt.shutdown()
    python_threads = {thread.native_id for thread in threading.enumerate()}
    print("REPORT " + json.dumps({
        "rank": rank, "idle_cpu_s": idle_cpu_s, "wait_cpu_s": wait_cpu_s,
        "connections_after_shutdown": established_tcp_connections(),
        "native_threads_after_shutdown": len(threads() - before_init - python_threads),
    }), flush=True)


if __name__ == "__main__":
    main()
