"""``CollectiveWatchdog``: a training step that waits too long for the others ends the worker."""

from __future__ import annotations

import itertools

import keras

from hvdtrain import watchdog


class CollectiveWatchdog(keras.callbacks.Callback):
    """End this worker, instead of hanging, when a training step waits too long for the others.

    A rank that skips a step (a rank-dependent code path), dies, or loses its network
    leaves the other ranks blocked in the step's gradient allreduce; under Gloo and on
    a cut link nothing in Horovod ends that wait. With this callback each call of the
    model's train function runs under :mod:`hvdtrain.watchdog`: after
    ``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` the waiting rank prints which step it
    waited for and on which rank, and exits with code 124, so the launcher stops the
    job. The first call is not watched: it traces and compiles the step, which can
    legitimately take longer than the limit.

    Example::

        model.fit(x, y, epochs=10, callbacks=[hvk.CollectiveWatchdog()])
    """

    def on_train_begin(self, logs=None) -> None:
        """Wrap the model's train function (once, however many times fit runs)."""
        train_function = self.model.train_function
        if getattr(train_function, "hvdtrain_watched", False):
            return
        calls = itertools.count()

        def watched(*args, **kwargs):
            call = next(calls)
            if call == 0:
                return train_function(*args, **kwargs)
            with watchdog.guard(f"the gradient allreduce of training step {call} "
                                "(counting train-function calls from 0)"):
                return train_function(*args, **kwargs)

        watched.hvdtrain_watched = True
        self.model.train_function = watched
