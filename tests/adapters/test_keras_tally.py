"""The Keras adapter's flat gradient buffer on TensorFlow (hvdtrain/adapters/keras/tally.py
and its ops in hvdtrain._tf_packing), in one process: a 2-rank average emulated by
adding two packed buffers and halving them, as Horovod's average does."""

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.adapters.keras import tally
from hvdtrain.tally import TALLY

MESSAGE = "hvdtrain: bad gradient at optimizer step {step} (counting from 0)"


def _gradients(bad: float | None = None, at: int = 0, scale: float = 1.0
               ) -> list[np.ndarray]:
    """Float32 gradients of awkward sizes (the second 33 x 17: a vectorised body and a tail,
    not a multiple of 16), with ``bad`` written at flat position ``at`` of the second."""
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(shape) * scale).astype("float32")
              for shape in ((7,), (33, 17), (5, 3), (16,))]
    if bad is not None:
        arrays[1].reshape(-1)[at] = bad
    return arrays


def _round_trip(arrays: list[np.ndarray], step: int = 0, *, check: bool = True,
                graph: bool = False) -> tuple[list[np.ndarray], np.ndarray]:
    def run(tensors):
        flat = tally.pack(tensors, bound=check)
        return tally.unpack(flat, [a.shape for a in arrays], tf.constant(step, tf.int64),
                            check=check, message=MESSAGE)

    tensors = [tf.constant(a) for a in arrays]
    views, numbers = (tf.function(run) if graph else run)(tensors)
    return [v.numpy() for v in views], numbers.numpy()


def test_the_ops_are_built_here():
    """scripts/setup.sh insists on them; without them the adapter quietly falls back."""
    assert tally.native_ops() is not None


def test_pack_aligns_each_gradient_and_ends_with_the_count_and_the_norm():
    arrays = _gradients()
    flat = tally.pack([tf.constant(a) for a in arrays], bound=True).numpy()
    offset = 0
    for array in arrays:
        assert offset % 16 == 0
        np.testing.assert_array_equal(flat[offset:offset + array.size], array.reshape(-1))
        padded = -(-array.size // 16) * 16
        assert not flat[offset + array.size:offset + padded].any()
        offset += padded
    assert flat.size == offset + TALLY
    assert flat[offset] == 1.0
    norm = np.sqrt(sum(float(np.sum(a.astype("float64") ** 2)) for a in arrays))
    assert flat[offset + 1] == pytest.approx(norm, rel=1e-6)
    unbounded = tally.pack([tf.constant(a) for a in arrays], bound=False).numpy()
    np.testing.assert_array_equal(unbounded[:-1], flat[:-1])
    assert unbounded[-1] == np.inf


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_an_averaged_buffer_unpacks_to_the_average_and_the_ranks_count(graph):
    one, two = _gradients(), _gradients(scale=3.0)
    shapes = [a.shape for a in one]

    def average(first, second):
        summed = (tally.pack(first, bound=True) + tally.pack(second, bound=True)) / 2
        return tally.unpack(summed, shapes, tf.constant(0, tf.int64), check=True,
                            message=MESSAGE)

    run = tf.function(average) if graph else average
    views, numbers = run([tf.constant(a) for a in one], [tf.constant(a) for a in two])
    for view, a, b in zip(views, one, two, strict=True):
        assert view.shape == a.shape
        np.testing.assert_allclose(view.numpy(), (a + b) / 2, rtol=1e-6)
    assert numbers.numpy()[0] == 1.0  # Horovod's average: (1 + 1) / 2


def test_every_kind_and_place_of_bad_value_stops_with_the_step_in_the_message():
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 1, 15, 16, 300, 33 * 17 - 1):
            arrays = _gradients(bad, at)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"bad gradient at optimizer step 41 \(counting"):
                _round_trip(arrays, step=41)
            views, numbers = _round_trip(arrays, check=False)  # unchecked: passed through
            assert not np.isfinite(numbers[1])
            np.testing.assert_array_equal(views[1], arrays[1])


def test_a_bound_that_overflows_is_decided_by_reading_the_gradients():
    """Squares of 3e38 overflow float32: the bound is infinite, the gradients finite."""
    arrays = [np.full(20, 3e38, "float32"), np.ones(3, "float32")]
    views, numbers = _round_trip(arrays, step=2)
    assert numbers[1] == np.inf
    np.testing.assert_array_equal(views[0], arrays[0])
    views, _ = _round_trip(arrays, step=2, graph=True)
    np.testing.assert_array_equal(views[1], arrays[1])


def test_a_buffer_of_the_wrong_size_is_refused_naming_both_sizes():
    flat = tf.zeros([40])
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds 40 elements, the shapes "
                                                             "need 50"):
        tally.unpack(flat, [(33,)], tf.constant(0, tf.int64), check=False, message=MESSAGE)


def test_float64_gradients_travel_and_are_checked_in_their_own_dtype():
    arrays = [a.astype("float64") * 1e200 for a in _gradients()]  # squares beyond float32
    views, numbers = _round_trip(arrays, step=3)
    for view, array in zip(views, arrays, strict=True):
        assert view.dtype == np.float64
        np.testing.assert_array_equal(view, array)
    assert numbers[1] == np.inf  # the square sum overflows float64 too; the read decides
    arrays[2][1, 1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="optimizer step 3 "):
        _round_trip(arrays, step=3)
    small = [a.astype("float64") for a in _gradients()]
    _, numbers = _round_trip(small)
    norm = np.sqrt(sum(float(np.sum(a ** 2)) for a in small))
    assert numbers[1] == pytest.approx(norm, rel=1e-12)


def test_only_float32_or_float64_tensors_of_one_dtype_and_known_shape_are_packed():
    assert tally.packs([tf.zeros([3]), tf.zeros([2, 2])])
    assert tally.packs([tf.zeros([3], tf.float64)])
    assert not tally.packs([tf.zeros([3], tf.float64), tf.zeros([3])])
    assert not tally.packs([tf.zeros([3], tf.float16)])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def unknown(tensor):
        assert not tally.packs([tensor])
        return tensor

    unknown(tf.zeros([3]))
