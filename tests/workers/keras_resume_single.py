"""A Keras model resumed by a job of one worker (no launcher: Horovod runs as a single
worker), as after loading one saved by a job of another size: ``python
keras_resume_single.py``. Prints ``REPORT {json}`` with the rate of the first batch
of ``fit(initial_epoch=1)`` with a LinearScalingWarmup (batch 4 per worker, base batch
2, η = 0.05 given as base_lr, 2 warmup epochs, 10 batches per epoch).
"""

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np

import hvdtrain.adapters.keras as hvk


class FirstRate(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if not hasattr(self, "lr"):
            self.lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


hvk.init()
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
# A loaded optimizer holds the last, scaled rate of the job that saved it.
model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse",
              jit_compile=False)
first = FirstRate()
model.fit(np.zeros((40, 3)), np.zeros((40, 2)), batch_size=4, initial_epoch=1, epochs=2,
          verbose=0, callbacks=[hvk.LinearScalingWarmup(batch_size_per_worker=4,
                                                        base_batch_size=2, warmup_epochs=2,
                                                        base_lr=0.05), first])
print("REPORT " + json.dumps({"size": hvk.size(), "lr": first.lr}), flush=True)
