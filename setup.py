"""The compiled parts of hvdtrain (the rest is in setup.cfg), both optional: without a
compiler (or TensorFlow) the package installs and the adapters use their frameworks'
own operations instead.

- ``hvdtrain._packing``: the torch adapter's fused copy and square sum (a CPython
  extension).
- ``hvdtrain._tf_packing``: the Keras adapter's flat-buffer ops on TensorFlow (a
  TensorFlow op library, loaded with ``tf.load_op_library``), built only when
  TensorFlow is installed, with TensorFlow's own compile and link flags.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup


def _tally_layout() -> list[tuple[str, str]]:
    """hvdtrain.gradients' tally layout as C macros, read from the source (the package's
    dependencies need not be installed to build it)."""
    path = Path(__file__).resolve().parent / "hvdtrain" / "gradients.py"
    spec = importlib.util.spec_from_file_location("_hvdtrain_gradients", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return [("HVDTRAIN_TALLY", str(module.TALLY)), ("HVDTRAIN_TALLY_COUNT", str(module.COUNT)),
            ("HVDTRAIN_TALLY_BOUND", str(module.BOUND))]


def _tensorflow_ops() -> list[Extension]:
    try:
        import tensorflow as tf
    except ImportError:
        return []
    return [Extension("hvdtrain._tf_packing", ["hvdtrain/_native/tf_packing.cc"],
                      language="c++", optional=True, define_macros=_tally_layout(),
                      extra_compile_args=["-O3", *tf.sysconfig.get_compile_flags()],
                      extra_link_args=tf.sysconfig.get_link_flags())]


setup(ext_modules=[Extension("hvdtrain._packing", ["hvdtrain/_native/packing.c"],
                             extra_compile_args=["-O3"], optional=True),
                   *_tensorflow_ops()])
