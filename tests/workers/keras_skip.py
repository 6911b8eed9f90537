"""``model.fit`` on 2 ranks where rank 1 stops joining at batch 3: ``python keras_skip.py``.

With ``hvk.CollectiveWatchdog`` rank 0, left waiting in the gradient allreduce, must
end itself after ``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` naming the step and rank 1.
Prints ``REPORT {json}`` with the rank's pid when it starts.
"""

import json
import os
import time

import keras
from keras_common import loss, make_data, make_model, shard

import hvdtrain.adapters.keras as hvk

hvk.init()
print("REPORT " + json.dumps({"rank": hvk.rank(), "event": "started", "pid": os.getpid()}),
      flush=True)


class StopJoiningAtBatch3(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if hvk.rank() == 1 and batch == 3:
            time.sleep(600)


x, y = shard(*make_data(), hvk.rank())
model = make_model()
model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=loss(),
              jit_compile=False)
model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False,
          callbacks=[hvk.BroadcastInitialState(), StopJoiningAtBatch3(),
                     hvk.CollectiveWatchdog()])
