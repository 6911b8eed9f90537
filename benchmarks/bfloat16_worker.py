"""Allreduce time of bfloat16 against float32 at the same element count, on every rank
of a horovodrun job: ``python bfloat16_worker.py MAX_FLOAT32_BYTES SECONDS_PER_SIZE``.

For element counts whose float32 buffers take 1 MiB, 4 MiB, ... up to
MAX_FLOAT32_BYTES, times Horovod's (synchronous) allreduce of a float32 and of a
bfloat16 tensor (hvdtrain's patch 0011-bfloat16), alternating the two in blocks of
repetitions so that both see the same machine. Rank 0 prints ``RESULT {json}`` with,
per count, each dtype's median time and their ratio.
"""

import json
import sys

import horovod.torch as hvd
import torch
from allreduce_worker import timed

import hvdtrain.adapters.torch as hvt

BLOCKS = 3  # float32, bfloat16, float32, bfloat16, ... each timed for a share of the budget


def main() -> None:
    max_bytes, budget_s = int(sys.argv[1]), float(sys.argv[2])
    torch.set_num_threads(1)
    hvt.init()
    rows, nbytes = [], 2**20
    while nbytes <= max_bytes:
        count = nbytes // 4
        tensors = {"float32": torch.randn(count), "bfloat16": torch.randn(count).bfloat16()}
        times: dict[str, list[float]] = {dtype: [] for dtype in tensors}
        for _ in range(BLOCKS):
            for dtype, tensor in tensors.items():
                times[dtype].append(timed(
                    lambda t=tensor, d=dtype: hvd.allreduce(t, name=f"bench.{d}"),
                    budget_s / BLOCKS))
        float32_s, bfloat16_s = (sorted(times[d])[BLOCKS // 2] for d in tensors)
        rows.append({"elements": count, "float32_bytes": nbytes, "float32_s": float32_s,
                     "bfloat16_s": bfloat16_s, "ratio": bfloat16_s / float32_s})
        nbytes *= 4
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "sizes": rows}), flush=True)


if __name__ == "__main__":
    main()
