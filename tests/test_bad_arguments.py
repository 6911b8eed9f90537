"""Bad arguments to every public function of each adapter raise an error that says what
is wrong and how to fix it (the schedule's own validators are property-tested in
test_schedule_properties.py). Each adapter's calls run in one single-worker process."""

import json
import subprocess
import sys

import pytest
from harness import WORKERS

# Every adapter's LinearScalingWarmup takes the same settings (hvdtrain.warmup).
UNKNOWN_WARMUP_ARGUMENT = ("TypeError: LinearScalingWarmup got an unknown argument warmup_epoch; "
                           "it takes ")
NO_STEPS_PER_EPOCH = "TypeError: LinearScalingWarmup needs steps_per_epoch=, the optimizer steps"

EXPECTED = {
    "torch": {
        "optimizer not an optimizer": "TypeError: optimizer must be a torch.optim.Optimizer, e.g.",
        "backward_passes_per_step 0": "backward_passes_per_step must be an int > 0, got 0",
        "backward_passes_per_step 1.5": "backward_passes_per_step must be an int > 0, got 1.5",
        "average_aggregated_gradients not a bool": "average_aggregated_gradients must be True "
                                                   "(the mean over micro-batches) or False",
        "unknown compression": "compression must be None, 'fp16' or 'bf16', got 'zip'",
        "unknown op": "op must be hvt.Average, hvt.Sum or hvt.Adasum",
        "overlap not a bool": "overlap must be True, False or None (automatic), got 'yes'",
        "overlap off with groups": "groups sets how the allreduces started during backward()",
        "duplicate parameter names": "ValueError: named_parameters has duplicate names: weight.",
        "parameters left unnamed": "ValueError: 1 of the optimizer's parameters are not in",
        "named_parameters not pairs": "ValueError: named_parameters must hold (name, parameter)",
        "predivide with Sum": "gradient_predivide_factor splits an average",
        "predivide 0": "gradient_predivide_factor must be a finite number > 0, got 0",
        "process_set not a set": "TypeError: process_set must be a Horovod process set",
        "warmup batch 0": "batch_size_per_worker must be an int > 0, got 0",
        "warmup steps_per_epoch 0": "steps_per_epoch must be an int > 0, got 0",
        "warmup negative epochs": "warmup_epochs must be a finite number >= 0",
        "warmup world size contradicts": "world_size=3 contradicts the launcher's 1 workers",
        "warmup lr 0": "every param group's learning rate is 0",
        "warmup gamma 0": "gamma must be a finite number > 0, got 0",
        "warmup milestones descending": "milestones must be strictly ascending, got (30, 10)",
        "warmup unknown argument": UNKNOWN_WARMUP_ARGUMENT,
        "warmup without steps_per_epoch": NO_STEPS_PER_EPOCH,
        "warmup passes not the optimizer's": "the optimizer accumulates 1 backward passes per "
                                             "step but LinearScalingWarmup got "
                                             "backward_passes_per_step=2",
        "broadcast_state not a model": "TypeError: model must be a torch.nn.Module, got str",
        "broadcast_state root out of range": "root_rank must be an int in [0, 1) for 1 workers",
        "verify_replicas not a model": "TypeError: model must be a torch.nn.Module, got str",
        "save_checkpoint missing folder": "nowhere does not exist; create it first",
        "load_checkpoint empty file": "empty.pt is empty (0 bytes)",
        "average_metrics not a number": "metric 'loss' must be a number or a one-element tensor",
        "distributed_sampler seed": "TypeError: seed must be an int (the same on every rank)",
    },
    "keras": {
        "optimizer not an optimizer": "TypeError: optimizer must be a Keras 3 optimizer instance",
        "backward_passes_per_step 0": "backward_passes_per_step must be an int > 0, got 0",
        "unknown compression": "compression must be None, 'fp16' or 'bf16', got 'zip'",
        "warmup batch 0": "batch_size_per_worker must be an int > 0, got 0",
        "warmup base_lr negative": "base_lr must be a finite number > 0, got -1.0",
        "warmup negative epochs": "warmup_epochs must be a finite number >= 0",
        "warmup unknown argument": UNKNOWN_WARMUP_ARGUMENT,
        "replica check every 0 epochs": "every_n_epochs must be an int > 0, got 0",
        "verify_replicas not a model": "TypeError: model must be a keras.Model, got str",
        "load_model missing file": "File not found: filepath=missing.keras",
        "tape not a tape": "TypeError: tape must be a tf.GradientTape, got str",
        "tf broadcast root out of range": "root_rank must be an int in [0, 1) for 1 workers",
        "tf warmup world size contradicts": "world_size=4 contradicts the launcher's 1 workers",
        "tf warmup unknown argument": UNKNOWN_WARMUP_ARGUMENT,
        "tf warmup without steps_per_epoch": NO_STEPS_PER_EPOCH,
    },
    "numpy": {
        "sgd lr 0": "lr must be > 0, got 0",
        "sgd momentum 1": "momentum must be in [0, 1), got 1.0",
        "sgd integer parameters": "params[0] must be a writeable floating-point NumPy array",
        "sgd wrong number of gradients": "step got 0 gradients for 1 parameters",
        "warmup not an optimizer": "TypeError: optimizer must be an hvn.DistributedSGD, got str",
        "warmup batch 0": "batch_size_per_worker must be an int > 0, got 0",
        "warmup world size contradicts": "world_size=4 contradicts the launcher's 1 workers",
        "warmup unknown argument": UNKNOWN_WARMUP_ARGUMENT,
        "warmup without steps_per_epoch": NO_STEPS_PER_EPOCH,
        "broadcast root out of range": "root_rank must be an int in [0, 1) for 1 workers",
        "allreduce_mean objects": "allreduce_mean needs a numeric array, got dtype=object",
        "broadcast_in_place not arrays": "broadcast_in_place needs writeable NumPy arrays",
        "verify_replicas not a sequence": "arrays must be a list or tuple of NumPy arrays",
    },
}


@pytest.mark.parametrize("framework", sorted(EXPECTED))
def test_every_bad_call_says_what_is_wrong(framework):
    done = subprocess.run([sys.executable, str(WORKERS / "bad_arguments.py"), framework],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = {entry["case"]: entry["error"] for entry in (
        json.loads(line.removeprefix("REPORT ")) for line in done.stdout.splitlines()
        if line.startswith("REPORT "))}
    assert sorted(errors) == sorted(EXPECTED[framework])
    for case, fragment in EXPECTED[framework].items():
        assert errors[case] is not None, f"{case}: nothing was raised"
        assert fragment in errors[case], (case, errors[case])
