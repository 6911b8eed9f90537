"""The compiled parts of hvdtrain (the rest is in setup.cfg), both optional: without a
compiler (or TensorFlow) the package installs and the adapters use their frameworks'
own operations instead.

- ``hvdtrain._packing``: the torch adapter's fused copy and square sum (a CPython
  extension).
- ``hvdtrain._tf_packing``: the Keras adapter's flat-buffer ops on TensorFlow (a
  TensorFlow op library, loaded with ``tf.load_op_library``), built only when
  TensorFlow is installed, with TensorFlow's own compile and link flags.
"""

import ast
from pathlib import Path

from setuptools import Extension, setup


def _tally_layout() -> list[tuple[str, str]]:
    """hvdtrain.tally's layout (TALLY, COUNT, BOUND) as C macros, read from its
    source's assignments (nothing of the package is imported to build it)."""
    tree = ast.parse((Path(__file__).resolve().parent / "hvdtrain" / "tally.py").read_text())
    values = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)
              and isinstance(node.value, ast.Constant)}
    return [(f"HVDTRAIN_{macro}", str(values[name])) for macro, name in
            (("TALLY", "TALLY"), ("TALLY_COUNT", "COUNT"), ("TALLY_BOUND", "BOUND"))]


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
