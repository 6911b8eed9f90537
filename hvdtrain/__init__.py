"""hvdtrain: data-parallel training on Horovod for current PyTorch, TensorFlow/Keras 3 and NumPy.

The core (this package) imports neither torch nor TensorFlow; each framework lives in
its own adapter under :mod:`hvdtrain.adapters`.
"""

from hvdtrain.deprecation import moved_modules

__version__ = "0.1.0"

# The running-jobs wing moved into hvdtrain.jobs; hvdtrain.ray stays a public path.
moved_modules({f"hvdtrain.{name}": f"hvdtrain.jobs.{name}"
               for name in ("cli", "doctor", "launch", "local_hosts", "slurm", "ray",
                            "_rank_entry", "_smoke", "plot")},
              public=("hvdtrain.ray",))
