"""One process, no launcher (Horovod runs as a single worker): ``python
keras_checkpoint_single.py FOLDER`` saves FOLDER/ckpt.keras with hvk.save_model
forever, every weight set to the step number before each save, and prints
"saved N" after each.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np

import hvdtrain.adapters.keras as hvk

FOLDER = Path(sys.argv[1])
hvk.init()
model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024),
                          keras.layers.Dense(1024)])  # 8 MB of weights
step = 0
while True:
    step += 1
    model.set_weights([np.full(w.shape, float(step), w.dtype) for w in model.get_weights()])
    hvk.save_model(model, FOLDER / "ckpt.keras")
    print(f"saved {step}", flush=True)
