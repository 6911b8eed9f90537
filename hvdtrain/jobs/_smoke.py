"""The 2-process allreduce that ``hvdtrain doctor`` runs under each controller.

``python _smoke.py torch|tensorflow``: every rank allreduces (Average) a tensor whose
entries depend on its rank, and compares the result with the mean computed here from
the same formula. Prints ``smoke: <framework> ok|FAILED ...`` on rank 0; exits
non-zero on a mismatch.

One framework per process: horovod.torch and horovod.tensorflow each carry their own
copy of Horovod's core with the same C++ symbols, and initialising both in one
process crashes under MPI (one library's background thread calls into the other's).
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

_FRAMEWORKS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


def _rank_values(rank: int) -> np.ndarray:
    return np.arange(8, dtype=np.float32) * (rank + 1) + rank


def _allreduce(framework: str, hvd, values: np.ndarray) -> np.ndarray:
    if framework == "torch":
        import torch

        return hvd.allreduce(torch.from_numpy(values), name="smoke.torch").numpy()
    import tensorflow as tf

    return hvd.allreduce(tf.constant(values), name="smoke.tf").numpy()


def main(framework: str) -> int:
    hvd = importlib.import_module(_FRAMEWORKS[framework])
    hvd.init()
    expected = np.mean([_rank_values(r) for r in range(hvd.size())], axis=0)
    got = _allreduce(framework, hvd, _rank_values(hvd.rank()))
    good = bool(np.allclose(got, expected, rtol=1e-6))
    if hvd.rank() == 0 or not good:
        detail = "" if good else f" (rank {hvd.rank()}: got {got}, expected {expected})"
        print(f"smoke: {framework} {'ok' if good else 'FAILED'} on {hvd.size()} ranks{detail}")
    hvd.shutdown()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
