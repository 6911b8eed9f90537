"""``run``: Horovod's elastic loop around a Keras training function."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from horovod.common.elastic import run_fn
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import step_timing
from hvdtrain.adapters.keras import backend, step_events
from hvdtrain.elastic import bounded_reset

__all__ = ["run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func(state, ...)`` through worker losses and additions (a decorator).

    Before the first call and after every reset, ``state.sync()`` gives every worker
    rank 0's state. When a collective fails because a worker is gone, every worker
    goes back to ``state``'s last commit, Horovod is started again on the workers
    left, and ``func`` is called again; when hosts are added, the same from the
    commit that noticed them.

    On Keras's TensorFlow backend a failed Horovod op inside ``fit`` surfaces as
    TensorFlow's ``UnknownError``; this recognises it by Horovod's op or message and
    treats it as the loss of a worker. (Horovod's own ``horovod.tensorflow.elastic.run``
    looks for op names that Keras 3's compiled steps do not show, and then returns
    None: ``fit`` would end silently, and training with it.) Any other error ends the
    job as it would without elasticity. A worker whose reset outlasts the elastic
    timeout (the job fell below ``--min-np`` and its launcher did not stop this
    worker) ends with a message saying so (:func:`hvdtrain.elastic.bounded_reset`).
    """

    @functools.wraps(func)
    def attempt(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            raise
        except Exception as error:
            if _is_horovod_failure(error):
                raise HorovodInternalError(error) from error
            raise

    return run_fn(attempt, bounded_reset(_reset))


def _is_horovod_failure(error: Exception) -> bool:
    """Whether ``error`` is TensorFlow's report of a failed Horovod collective."""
    if backend.horovod().__name__ != "horovod.tensorflow":
        return False
    import tensorflow as tf

    return isinstance(error, tf.errors.UnknownError) and "horovod" in str(error).lower()


def _reset() -> None:
    """Start Horovod again on the workers there are now (as Horovod's own reset does:
    hvdtrain's defaults are in the environment since the first ``init``, and its
    watchdog and failure report stay in place)."""
    hvd = backend.horovod()
    hvd.shutdown()
    hvd.init()
    step_timing.restart(new_workers=True)
    step_events.discard_pending()
