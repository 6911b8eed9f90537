"""Runs on each of 2 ranks: ``horovod.tensorflow.join()`` once per epoch with uneven
shares (patch 0005), in eager mode, as ``JoinAtEpochEnd`` calls it.

``python horovod_tf_join.py``. Rank 0 has 3 steps per epoch and rank 1 has 2; rank 0
waits LATE_S before its third. Prints ``REPORT {json}`` per rank with ``joins_s`` (how
long each epoch's join took: rank 1's must include that wait every epoch) and
``counts`` (each step's sum of the ranks' 1s: 1 once rank 1 has joined).
"""

import json
import time

import horovod.tensorflow as hvd
import tensorflow as tf

import hvdtrain.adapters.tensorflow as hvtf

EPOCHS, LATE_S = 3, 0.5


def main() -> None:
    hvtf.init()
    joins_s, counts = [], []
    for _ in range(EPOCHS):
        for step in range(3 if hvd.rank() == 0 else 2):
            if step == 2:
                time.sleep(LATE_S)
            _, count = hvd.grouped_allreduce([tf.ones(3), tf.ones(())], op=hvd.Sum,
                                             name="steps")
            counts.append(float(count))
        started = time.monotonic()
        hvd.join()
        joins_s.append(time.monotonic() - started)
    print("REPORT " + json.dumps({"rank": hvd.rank(), "joins_s": joins_s, "counts": counts}),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
