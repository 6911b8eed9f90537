"""The Horovod of Keras's backend (hvdtrain/adapters/keras/backend.py), on each backend
in a fresh process: which Horovod module, the bfloat16 bit view Horovod's broadcasts
need, and where a graph is running. Its Collective and TensorCollective move data on
2 real ranks in test_keras_optimizer.py (``tensor_collective``)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_BACKEND = textwrap.dedent("""
    import json
    import keras, numpy as np
    from hvdtrain.adapters.keras import backend

    values = np.array([1.0, -2.5, 3.0e38, 1.0e-30], dtype="float32")
    bf16 = keras.ops.cast(keras.ops.convert_to_tensor(values), "bfloat16")
    bits = backend.bitcast16(bf16, "int16")
    back = backend.bitcast16(bits, "bfloat16")
    report = {
        "horovod": backend.horovod().__name__,
        "bits_dtype": keras.backend.standardize_dtype(bits.dtype),
        "round_trip": keras.ops.convert_to_numpy(keras.ops.cast(back, "float32")).tolist()
            == keras.ops.convert_to_numpy(keras.ops.cast(bf16, "float32")).tolist(),
        "eager_is_graph": backend.in_tensorflow_graph(),
        "unscoped": backend.UNSCOPED,
    }
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        report["traced_is_graph"] = bool(tf.function(backend.in_tensorflow_graph)())
    print(json.dumps(report))
""")


def _report(keras_backend: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _BACKEND], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KERAS_BACKEND": keras_backend})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("keras_backend", "module"), [
    ("tensorflow", "horovod.tensorflow"), ("torch", "horovod.torch")])
def test_each_backend_gets_its_own_horovod_and_bit_views(keras_backend, module):
    report = _report(keras_backend)
    assert report["horovod"] == module
    assert report["bits_dtype"] == "int16" and report["round_trip"]
    assert report["eager_is_graph"] is False


def test_a_graph_is_seen_only_inside_a_traced_function_on_tensorflow():
    report = _report("tensorflow")
    assert report["traced_is_graph"] is True
    assert report["unscoped"] == {"ignore_name_scope": True}


def test_the_torch_backend_takes_no_name_scope_argument():
    assert _report("torch")["unscoped"] == {}
