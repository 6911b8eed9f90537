"""Rank 1 aborts in native code (``os.abort()``, as a C++ ``std::terminate`` would);
rank 0 returns at once."""

import os

from hvdtrain.runtime import launcher_rank


def crash_in_native_code() -> None:
    print("rank 1 crashes now", flush=True)
    os.abort()


if launcher_rank() == 1:
    crash_in_native_code()
