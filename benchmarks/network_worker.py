"""Collective times on every rank of a horovodrun job across hosts:
``python network_worker.py MAX_BYTES SECONDS_PER_POINT``.

For float32 buffers of 16 KiB, 64 KiB, ... up to MAX_BYTES, times Horovod's allreduce,
reduce-scatter (each rank gets 1/N of the buffer) and allgather (each rank gives 1/N,
all get the whole buffer), each until SECONDS_PER_POINT have passed (3 to 200
repetitions, after one warm-up; allreduce_worker.py's ``timed``). Rank 0 prints
``RESULT {json}``: per operation and size, the median time, the bus bandwidth (NCCL's
measure: what each rank's link carried per second, (N-1)/N x bytes / time, twice that
for allreduce), and how busy this machine's CPUs were meanwhile, in all and in interrupts
(the emulated links' forwarding and shaping run there, as softirqs).
"""

import json
import sys

import torch
from allreduce_worker import timed
from ring_model import OPERATIONS, ring_terms

import hvdtrain.adapters.torch as hvt

SMALLEST_BYTES = 16 * 1024


def cpu_ticks() -> tuple[int, int, int]:
    """This machine's CPU ticks so far: (busy, in interrupts, all), from /proc/stat."""
    with open("/proc/stat") as stat:
        # user nice system idle iowait irq softirq steal (guest time is within user)
        ticks = [int(value) for value in stat.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, ticks[5] + ticks[6], sum(ticks)


def cpu_shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict:
    """The share of CPU time busy, and in interrupts, between two :func:`cpu_ticks`."""
    busy, interrupts, total = (b - a for a, b in zip(before, after, strict=True))
    total = max(total, 1)
    return {"cpu_busy": busy / total, "cpu_interrupts": interrupts / total}


def collective(operation: str, nbytes: int):
    """A callable running ``operation`` on a buffer of ``nbytes`` (the whole buffer)."""
    elements = nbytes // 4
    if operation == "allreduce":
        tensor = torch.ones(elements)
        return lambda: hvt.allreduce(tensor, name="net.allreduce", op=hvt.Sum)
    if operation == "reducescatter":
        tensor = torch.ones(elements)
        return lambda: hvt.reducescatter(tensor, name="net.reducescatter", op=hvt.Sum)
    part = torch.ones(elements // hvt.size())
    return lambda: hvt.allgather(part, name="net.allgather")


def main() -> None:
    max_bytes, budget_s = int(sys.argv[1]), float(sys.argv[2])
    torch.set_num_threads(1)
    hvt.init()
    workers, points = hvt.size(), []
    nbytes = SMALLEST_BYTES
    while nbytes <= max_bytes:
        for operation in OPERATIONS:
            before = cpu_ticks()
            seconds = timed(collective(operation, nbytes), budget_s)
            cpu = cpu_shares(before, cpu_ticks())
            _, moved = ring_terms(operation, workers, nbytes)
            points.append({"operation": operation, "bytes": nbytes, "seconds": seconds,
                           "bus_bandwidth_gbit_s": 8 * moved / seconds / 1e9, **cpu})
        nbytes *= 4
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": workers, "points": points}), flush=True)
    hvt.shutdown()


if __name__ == "__main__":
    main()
