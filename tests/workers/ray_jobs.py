"""Training functions that tests/test_ray.py runs on Ray workers through hvdtrain.jobs.ray.run.

Each one trains (or fails) as a 2-worker Horovod job on Ray would and returns what the
test compares: the torch and Keras ones the same training as the horovodrun workers'
equivalence scenarios (tests/workers/torch_adapter.py, keras_adapter.py), whose test
repeats it in one process on the concatenated batch.
"""

import os
import signal
import time


def torch_train(kind: str) -> dict:
    """20 steps of torch_common's problem through DistributedOptimizer and
    LinearScalingWarmup, rank 1 starting from other weights until broadcast_state."""
    import torch
    from torch_common import (
        STEPS,
        STEPS_PER_EPOCH,
        WARMUP_EPOCHS,
        loss_fn,
        make_data,
        make_model,
        make_optimizer,
        rows,
    )

    import hvdtrain.adapters.torch as hvt

    hvt.init()
    torch.set_num_threads(1)
    x, y = make_data()
    model = make_model(seed=123 if hvt.rank() == 0 else 999)
    optimizer = hvt.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                         model.named_parameters())
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=4, steps_per_epoch=STEPS_PER_EPOCH,
        base_batch_size=4, warmup_epochs=WARMUP_EPOCHS)
    hvt.broadcast_state(model, optimizer, scheduler)
    lrs = []
    for step in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        part = rows(step, 0, hvt.rank(), 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()
        scheduler.step()
    hvt.verify_replicas(model)
    return {"rank": hvt.rank(), "size": hvt.size(), "lrs": lrs, "pid": os.getpid(),
            "parameters": {name: p.detach().tolist() for name, p in model.named_parameters()}}


def keras_fit(kind: str) -> dict:
    """keras_common's problem through hvk.DistributedOptimizer and model.fit with
    BroadcastInitialState and LinearScalingWarmup (the TensorFlow backend)."""
    from keras_common import (
        BATCH_PER_WORKER,
        EPOCHS,
        WARMUP_EPOCHS,
        loss,
        make_data,
        make_model,
        make_optimizer,
        shard,
        use_floatx,
    )

    import hvdtrain.adapters.keras as hvk

    hvk.init()
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model(seed=123 if hvk.rank() == 0 else 999)
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer(kind)), loss=loss(),
                  jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState(),
                         hvk.LinearScalingWarmup(batch_size_per_worker=BATCH_PER_WORKER,
                                                 base_batch_size=BATCH_PER_WORKER,
                                                 warmup_epochs=WARMUP_EPOCHS),
                         hvk.ReplicaCheck()])
    return {"rank": hvk.rank(), "weights": [w.tolist() for w in model.get_weights()]}


def fail(how: str) -> str:
    """Both ranks train torch_common's model through DistributedOptimizer; at step 3
    rank 1 fails ``how``: ``raise`` (a ValueError), ``kill`` (SIGKILL of its own
    process) or ``skip`` (it skips the step's gradient allreduce and returns, so rank 0
    waits for it until the collective watchdog ends it)."""
    import torch
    from torch_common import loss_fn, make_data, make_model, make_optimizer, rows

    import hvdtrain.adapters.torch as hvt

    hvt.init()
    torch.set_num_threads(1)
    x, y = make_data()
    model = make_model()
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters())
    for step in range(1000):
        if hvt.rank() == 1 and step == 3:
            if how == "raise":
                raise ValueError("rank 1 found a corrupt shard")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "skip":
                return "skipped"
        optimizer.zero_grad()
        part = rows(step % 20, 0, hvt.rank(), 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()
        time.sleep(0.05)
    return "finished"


def torch_elastic(mode: str) -> None:
    """tests/workers/torch_elastic_train.py's job in ``mode`` (``shrink``: rank 2 of 3
    kills itself at step 14), its reports appended to ``HVDTRAIN_TEST_REPORTS``."""
    import torch_elastic_train

    torch_elastic_train.main(mode, None)
