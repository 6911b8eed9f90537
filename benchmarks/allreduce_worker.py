"""Allreduce latency and bandwidth on every rank of a horovodrun job, with this
machine's single-core memory-copy bandwidth measured in the same process:
``python allreduce_worker.py MAX_BYTES SECONDS_PER_SIZE``.

For float32 buffers of 1 KiB, 4 KiB, ... up to MAX_BYTES, times Horovod's
(synchronous) allreduce until SECONDS_PER_SIZE have passed (3 to 200 repetitions,
after one warm-up) and, on rank 0, a single-threaded copy of a buffer of the same
size. Rank 0 prints ``RESULT {json}`` with, per size, the median allreduce time, the
bus bandwidth 2(n-1)/n x bytes / time (what each rank's link must carry), and the
copy bandwidth bytes / time.
"""

import json
import statistics
import sys
import time

import horovod.torch as hvd
import torch

import hvdtrain.adapters.torch as hvt

MIN_REPEATS, MAX_REPEATS = 3, 200


def timed(action, budget_s: float) -> float:
    """The median time of ``action`` over repetitions filling ``budget_s`` (after one
    warm-up). Every rank runs the same number of repetitions, agreed by rank 0."""
    action()
    times: list[float] = []
    while True:
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
        enough = len(times) >= MAX_REPEATS or (
            len(times) >= MIN_REPEATS and sum(times) >= budget_s)
        decision = hvd.broadcast_object(enough, root_rank=0, name="bench.enough")
        if decision:
            return statistics.median(times)


def main() -> None:
    max_bytes, budget_s = int(sys.argv[1]), float(sys.argv[2])
    torch.set_num_threads(1)
    hvt.init()
    sizes, size = [], 1024
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    rows = []
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4, dtype=torch.float32)
        allreduce_s = timed(lambda t=tensor: hvd.allreduce(t, name="bench.allreduce"),
                            budget_s)
        source, target = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        copy_s = timed(lambda s=source, t=target: t.copy_(s), budget_s / 4)
        n = hvt.size()
        rows.append({"bytes": nbytes, "allreduce_s": allreduce_s,
                     "bus_bandwidth_gbps": 2 * (n - 1) / n * nbytes / allreduce_s / 1e9,
                     "copy_s": copy_s, "copy_bandwidth_gbps": nbytes / copy_s / 1e9})
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "sizes": rows}), flush=True)


if __name__ == "__main__":
    main()
