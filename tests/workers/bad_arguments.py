"""Calls every public function of one adapter with bad arguments, as a single worker
(no launcher): ``python bad_arguments.py torch|keras|numpy``.

Prints ``REPORT {json}`` per case with the error's type and message (or null when
nothing was raised); tests/test_bad_arguments.py holds what each message must say.
"""

import json
import sys
import tempfile
from pathlib import Path

FRAMEWORK = sys.argv[1]


def torch_cases():
    import torch

    import hvdtrain.adapters.torch as hvt

    hvt.init()
    model = torch.nn.Linear(2, 1)

    def sgd(lr=0.1):
        return torch.optim.SGD(model.parameters(), lr=lr)

    def wrapped(**kwargs):
        return hvt.DistributedOptimizer(sgd(), model.named_parameters(), **kwargs)

    def warmup(optimizer=None, **kwargs):
        arguments = {"batch_size_per_worker": 32, "steps_per_epoch": 10, **kwargs}
        return hvt.LinearScalingWarmup(optimizer or wrapped(), **arguments)

    folder = Path(tempfile.mkdtemp())
    (folder / "empty.pt").write_bytes(b"")
    return {
        "optimizer not an optimizer": lambda: hvt.DistributedOptimizer("sgd"),
        "backward_passes_per_step 0": lambda: wrapped(backward_passes_per_step=0),
        "backward_passes_per_step 1.5": lambda: wrapped(backward_passes_per_step=1.5),
        "average_aggregated_gradients not a bool": lambda: wrapped(
            backward_passes_per_step=2, average_aggregated_gradients="mean"),
        "unknown compression": lambda: wrapped(compression="zip"),
        "unknown op": lambda: wrapped(op="mean"),
        "overlap not a bool": lambda: wrapped(overlap="yes"),
        "overlap off with groups": lambda: wrapped(overlap=False, groups=2),
        "duplicate parameter names": lambda: hvt.DistributedOptimizer(
            sgd(), [("weight", model.weight), ("weight", model.bias)]),
        "parameters left unnamed": lambda: hvt.DistributedOptimizer(
            sgd(), [("weight", model.weight)]),
        "named_parameters not pairs": lambda: hvt.DistributedOptimizer(sgd(), [model.weight]),
        "predivide with Sum": lambda: wrapped(gradient_predivide_factor=2.0, op=hvt.Sum),
        "predivide 0": lambda: wrapped(gradient_predivide_factor=0),
        "process_set not a set": lambda: wrapped(process_set=[0]),
        "warmup batch 0": lambda: warmup(batch_size_per_worker=0),
        "warmup steps_per_epoch 0": lambda: warmup(steps_per_epoch=0),
        "warmup negative epochs": lambda: warmup(warmup_epochs=-1),
        "warmup world size contradicts": lambda: warmup(world_size=3),
        "warmup lr 0": lambda: warmup(hvt.DistributedOptimizer(sgd(0.0), model.named_parameters())),
        "warmup gamma 0": lambda: warmup(gamma=0),
        "warmup milestones descending": lambda: warmup(milestones=(30, 10)),
        "warmup unknown argument": lambda: warmup(warmup_epoch=5),
        "warmup without steps_per_epoch": lambda: hvt.LinearScalingWarmup(
            wrapped(), batch_size_per_worker=32),
        "warmup passes not the optimizer's": lambda: warmup(backward_passes_per_step=2),
        "broadcast_state not a model": lambda: hvt.broadcast_state("model"),
        "broadcast_state root out of range": lambda: hvt.broadcast_state(model, root_rank=5),
        "verify_replicas not a model": lambda: hvt.verify_replicas("model"),
        "save_checkpoint missing folder": lambda: hvt.save_checkpoint(
            folder / "nowhere" / "ckpt.pt", model),
        "load_checkpoint empty file": lambda: hvt.load_checkpoint(folder / "empty.pt", model),
        "average_metrics not a number": lambda: hvt.average_metrics({"loss": "low"}),
        "distributed_sampler seed": lambda: hvt.distributed_sampler(list(range(8)), seed="a"),
    }


def keras_cases():
    import keras
    import tensorflow as tf

    import hvdtrain.adapters.keras as hvk
    import hvdtrain.adapters.tensorflow as hvtf

    hvk.init()
    return {
        "optimizer not an optimizer": lambda: hvk.DistributedOptimizer("sgd"),
        "backward_passes_per_step 0": lambda: hvk.DistributedOptimizer(
            keras.optimizers.SGD(0.1), backward_passes_per_step=0),
        "unknown compression": lambda: hvk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                                compression="zip"),
        "warmup batch 0": lambda: hvk.LinearScalingWarmup(batch_size_per_worker=0),
        "warmup base_lr negative": lambda: hvk.LinearScalingWarmup(batch_size_per_worker=2,
                                                                    base_lr=-1.0),
        "warmup negative epochs": lambda: hvk.LinearScalingWarmup(batch_size_per_worker=2,
                                                                   warmup_epochs=-1),
        "warmup unknown argument": lambda: hvk.LinearScalingWarmup(batch_size_per_worker=2,
                                                                    warmup_epoch=5),
        "replica check every 0 epochs": lambda: hvk.ReplicaCheck(every_n_epochs=0),
        "verify_replicas not a model": lambda: hvk.verify_replicas("model"),
        "load_model missing file": lambda: hvk.load_model("missing.keras"),
        "tape not a tape": lambda: hvtf.DistributedGradientTape("tape"),
        "tf broadcast root out of range": lambda: hvtf.broadcast_variables(
            [tf.Variable(1.0)], root_rank=3),
        "tf warmup world size contradicts": lambda: hvtf.LinearScalingWarmup(
            base_lr=0.1, batch_size_per_worker=2, steps_per_epoch=5, world_size=4),
        "tf warmup unknown argument": lambda: hvtf.LinearScalingWarmup(
            0.1, batch_size_per_worker=2, steps_per_epoch=5, warmup_epoch=5),
        "tf warmup without steps_per_epoch": lambda: hvtf.LinearScalingWarmup(
            0.1, batch_size_per_worker=2),
    }


def numpy_cases():
    import numpy as np

    import hvdtrain.adapters.numpy as hvn

    hvn.init()
    weights = [np.zeros(3)]

    def warmup(**kwargs):
        arguments = {"batch_size_per_worker": 2, "steps_per_epoch": 3, **kwargs}
        return hvn.LinearScalingWarmup(hvn.DistributedSGD(weights, lr=0.1), **arguments)

    return {
        "sgd lr 0": lambda: hvn.DistributedSGD(weights, lr=0),
        "sgd momentum 1": lambda: hvn.DistributedSGD(weights, lr=0.1, momentum=1.0),
        "sgd integer parameters": lambda: hvn.DistributedSGD([np.zeros(3, int)], lr=0.1),
        "sgd wrong number of gradients": lambda: hvn.DistributedSGD(weights, lr=0.1).step([]),
        "warmup not an optimizer": lambda: hvn.LinearScalingWarmup(
            "sgd", batch_size_per_worker=2, steps_per_epoch=3),
        "warmup batch 0": lambda: warmup(batch_size_per_worker=0),
        "warmup world size contradicts": lambda: warmup(world_size=4),
        "warmup unknown argument": lambda: warmup(warmup_epoch=5),
        "warmup without steps_per_epoch": lambda: hvn.LinearScalingWarmup(
            hvn.DistributedSGD(weights, lr=0.1), batch_size_per_worker=2),
        "broadcast root out of range": lambda: hvn.broadcast(np.zeros(2), root_rank=3),
        "allreduce_mean objects": lambda: hvn.allreduce_mean(np.array([object()])),
        "broadcast_in_place not arrays": lambda: hvn.broadcast_in_place([1]),
        "verify_replicas not a sequence": lambda: hvn.verify_replicas(5),
    }


CASES = {"torch": torch_cases, "keras": keras_cases, "numpy": numpy_cases}[FRAMEWORK]()
for case, call in CASES.items():
    try:
        call()
        error = None
    except Exception as raised:  # every kind is reported; the test says which is right
        error = f"{type(raised).__name__}: {raised}"
    print("REPORT " + json.dumps({"case": case, "error": error}), flush=True)
