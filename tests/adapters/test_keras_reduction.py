"""hvdtrain/adapters/keras/backend.py and reduction.py in one process: the choice of
Horovod module and the finite test of the non-finite check."""

import keras
import numpy as np
import pytest


def test_an_unsupported_keras_backend_gets_an_error_naming_the_supported_ones(monkeypatch):
    """No other Keras backend can be installed here (JAX is absent), so Keras is told it
    runs on JAX; the adapter's own backend choice is what is under test."""

    from hvdtrain.adapters.keras import backend

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="supports the Keras backends tensorflow and torch, "
                                           "not 'jax'; set KERAS_BACKEND=tensorflow"):
        backend.horovod.__wrapped__()


def _gradients(bad: float | None = None, at: int = 0) -> list:
    """Three float32 gradient-like arrays (the second 33 x 17, so its sum has a vectorised body and
    a tail), with ``bad`` written at flat position ``at`` of the second."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype("float32") for shape in ((7,), (33, 17), (5, 3))]
    if bad is not None:
        arrays[1].reshape(-1)[at] = bad
    return arrays


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_all_finite_agrees_with_numpy_for_every_position_and_kind_of_bad_value(graph):
    import tensorflow as tf

    from hvdtrain.adapters.keras import reduction

    check = tf.function(reduction.all_finite) if graph else reduction.all_finite
    cases = [("clean", _gradients())]
    for bad in (np.nan, np.inf, -np.inf):
        cases += [(f"{bad} at {at}", _gradients(bad, at))
                  for at in (0, 1, 7, 8, 15, 16, 300, 33 * 17 - 1)]
    for label, arrays in cases:
        tensors = [tf.constant(a) for a in arrays]
        expected = all(np.isfinite(a).all() for a in arrays)
        assert bool(check(tensors)) is expected, label


def test_all_finite_decides_exactly_when_the_sum_is_not_finite():
    """Finite values whose sum overflows are finite; +Inf and -Inf in different tensors
    (their sum is NaN) are not; float16 and float64 are judged in their own dtype."""
    import tensorflow as tf

    from hvdtrain.adapters.keras import reduction

    big = np.float32(3e38)
    assert bool(reduction.all_finite([tf.constant([big, big]), tf.constant([big])]))
    assert not bool(reduction.all_finite([tf.constant([np.inf]), tf.constant([-np.inf])]))
    assert bool(reduction.all_finite([tf.constant(np.full(4, 6e4, "float16"))]))
    assert not bool(reduction.all_finite([tf.constant(np.array([1.0, np.inf], "float16"))]))
    assert bool(reduction.all_finite([tf.constant(np.full(3, 1e300))]))
    assert not bool(reduction.all_finite([tf.constant(np.array([1e300, np.nan]))]))
