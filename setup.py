"""The compiled parts of hvdtrain (the rest is in setup.cfg), both optional: without a
compiler (or TensorFlow) the package installs and the adapters use their frameworks'
own operations instead.

- ``hvdtrain._packing``: the torch adapter's fused copy and square sum (a CPython
  extension).
- ``hvdtrain._tf_packing``: the Keras adapter's flat-buffer ops on TensorFlow (a
  TensorFlow op library, loaded with ``tf.load_op_library``), built only when
  TensorFlow is installed, with TensorFlow's own compile and link flags.
"""

from setuptools import Extension, setup


def _tensorflow_ops() -> list[Extension]:
    try:
        import tensorflow as tf
    except ImportError:
        return []
    return [Extension("hvdtrain._tf_packing", ["hvdtrain/_native/tf_packing.cc"],
                      language="c++", optional=True,
                      extra_compile_args=["-O3", *tf.sysconfig.get_compile_flags()],
                      extra_link_args=tf.sysconfig.get_link_flags())]


setup(ext_modules=[Extension("hvdtrain._packing", ["hvdtrain/_native/packing.c"],
                             extra_compile_args=["-O3"], optional=True),
                   *_tensorflow_ops()])
