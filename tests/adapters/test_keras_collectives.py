"""hvdtrain/adapters/keras/collectives.py in one process: the choice of Horovod module."""

import keras
import pytest


def test_an_unsupported_keras_backend_gets_an_error_naming_the_supported_ones(monkeypatch):
    """No other Keras backend can be installed here (JAX is absent), so Keras is told it
    runs on JAX; the adapter's own backend choice is what is under test."""
    from hvdtrain.adapters.keras import collectives

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="supports the Keras backends tensorflow and torch, "
                                           "not 'jax'; set KERAS_BACKEND=tensorflow"):
        collectives.horovod.__wrapped__()
