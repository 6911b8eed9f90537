"""The 2-process allreduce that ``hvdtrain doctor`` runs under each controller.

Every rank allreduces (Average) a tensor whose entries depend on its rank with each
framework Horovod was built for, and compares the result with the mean computed
here from the same formula. Prints one ``smoke: <framework> ok|FAILED ...`` line per
framework on rank 0; exits non-zero on any mismatch.
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


def main(frameworks: list[str]) -> int:
    # Initialise every framework's Horovod before any shuts down: with MPI, the first
    # shutdown may finalise MPI, which cannot be initialised again in this process.
    modules = {name: importlib.import_module(_FRAMEWORKS[name]) for name in frameworks}
    for hvd in modules.values():
        hvd.init()
    failures = 0
    for framework, hvd in modules.items():
        expected = np.mean([_rank_values(r) for r in range(hvd.size())], axis=0)
        got = _allreduce(framework, hvd, _rank_values(hvd.rank()))
        good = np.allclose(got, expected, rtol=1e-6)
        failures += not good
        if hvd.rank() == 0 or not good:
            detail = "" if good else f" (rank {hvd.rank()}: got {got}, expected {expected})"
            print(f"smoke: {framework} {'ok' if good else 'FAILED'} on {hvd.size()} ranks{detail}")
    for hvd in modules.values():
        hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
