"""hvdtrain: data-parallel training on Horovod for current PyTorch, TensorFlow/Keras 3 and NumPy.

The core (this package) imports neither torch nor TensorFlow; each framework lives in
its own adapter under :mod:`hvdtrain.adapters`.
"""

__version__ = "0.1.0"
