"""Runs on each of 2 ranks: every check of hvdtrain.adapters.torch in one launch.

``python torch_adapter.py OUTDIR``. Each scenario prints ``REPORT {json}`` lines and
saves tensors as OUTDIR/<name>-rank<r>.pt; tests/adapters/test_torch_*.py compare
them with an independent single-process computation and across ranks.
"""

import functools
import os
import sys
import warnings
from pathlib import Path

import horovod
import torch
from scenarios import EventRecorder, exercise_tensor_collective, run_scenarios
from scenarios import report as report_for_rank
from torch_common import (
    STEPS,
    STEPS_PER_EPOCH,
    WARMUP_EPOCHS,
    loss_fn,
    make_data,
    make_model,
    make_optimizer,
    rows,
    train_uneven_share,
)

import hvdtrain.adapters.torch as hvt
from hvdtrain import horovod_patches
from hvdtrain.adapters.torch._horovod import tensors
from hvdtrain.step_events import step_observers

OUT = Path(sys.argv[1])


def report(scenario: str, **values) -> None:
    report_for_rank(hvt.rank(), scenario, **values)


def save(name: str, tensors: dict) -> None:
    torch.save(tensors, OUT / f"{name}-rank{hvt.rank()}.pt")


def checksum(model: torch.nn.Module) -> str:
    return hvt.state_fingerprint(model)


def parameters(model: torch.nn.Module) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train(name: str, kind: str, passes: int = 1, dtype=torch.float64, divide_loss=False,
          clip: float | None = None, clip_with: str = "optimizer", replace_data=False,
          **wrapper) -> None:
    """20 steps on this rank's shards through DistributedOptimizer + LinearScalingWarmup;
    with ``divide_loss`` each micro-batch's loss is divided by ``passes`` (Horovod's
    accumulation sums the micro-batches and leaves that to the script); with ``clip``
    the averaged gradients are clipped to that norm between synchronize() and step(), by
    ``optimizer.clip_grad_norm_`` or (``clip_with="torch"``) torch's own; with
    ``replace_data`` every parameter's ``data`` is replaced by a copy halfway."""
    x, y = make_data(dtype=dtype, workers=hvt.size())
    # Rank 0 starts from the reference's weights; rank 1 from others until the broadcast.
    model = make_model(seed=123 if hvt.rank() == 0 else 999, dtype=dtype)
    optimizer = hvt.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                         model.named_parameters(),
                                         backward_passes_per_step=passes, **wrapper)
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=4, steps_per_epoch=STEPS_PER_EPOCH, base_batch_size=4,
        warmup_epochs=WARMUP_EPOCHS, backward_passes_per_step=passes,
    )
    hvt.broadcast_state(model, optimizer, scheduler)
    lrs, checksums = [], []
    for step in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        if replace_data and step == STEPS // 2:
            for parameter in model.parameters():
                parameter.data = parameter.data.clone()
        optimizer.zero_grad()
        for micro in range(passes):
            part = rows(step, micro, hvt.rank(), passes, hvt.size())
            (loss_fn(model, x[part], y[part]) / (passes if divide_loss else 1)).backward()
        if clip is None:
            optimizer.step()
        else:
            optimizer.synchronize()
            if clip_with == "torch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:
                optimizer.clip_grad_norm_(clip)
            with optimizer.skip_synchronize():
                optimizer.step()
        scheduler.step()
        checksums.append(checksum(model))
    report(name, lrs=lrs, checksums=checksums, overlap=optimizer.overlap,
           state_sizes=sorted({value.numel() for state in optimizer.state.values()
                               for value in state.values()
                               if torch.is_tensor(value) and value.dim() > 0}))
    save(name, parameters(model))


def scenario_runtime_defaults() -> None:
    """What init() chose for this Horovod build (hvdtrain.runtime, hvdtrain.horovod_patches)."""
    report("runtime_defaults", patches=sorted(horovod_patches.installed()),
           horovod=horovod.__file__,
           **{name: os.environ.get(name) for name in ("HOROVOD_CYCLE_TIME",
                                                     "HVDTRAIN_IDLE_WAIT_MS")})


def scenario_broadcast_state() -> None:
    model = make_model(seed=500 + hvt.rank())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = make_data()
    if hvt.rank() == 0:  # only rank 0 has Adam moments and a scheduler that moved
        for step in range(3):
            optimizer.zero_grad()
            loss_fn(model, x[rows(step, 0, 0, 1)], y[rows(step, 0, 0, 1)]).backward()
            optimizer.step()
            scheduler.step()
    before = checksum(model)
    extra = hvt.broadcast_state(model, optimizer, scheduler,
                                extra={"epoch": 3, "seed": 41} if hvt.rank() == 0 else None)
    after = checksum(model)
    try:
        hvt.verify_replicas(model, optimizer)
        identical = True
    except hvt.ReplicaMismatchError:
        identical = False
    report("broadcast_state", before=before, after=after, extra=extra, identical=identical,
           adam_state_entries=len(optimizer.state), last_lr=scheduler.get_last_lr())

    # Neither rank has optimizer state yet: nothing may touch the weights.
    fresh = make_model(seed=600 + hvt.rank())
    adam = torch.optim.Adam(fresh.parameters(), lr=0.01, weight_decay=0.1)
    fresh_before = checksum(fresh)
    hvt.broadcast_state(fresh, adam)
    report("broadcast_fresh", before=fresh_before, after=checksum(fresh),
           state_entries=len(adam.state))


def scenario_mismatch() -> None:
    for label, model in (
        ("shape", make_model(hidden=5 if hvt.rank() == 0 else 4)),
        ("dtype", make_model(dtype=torch.float64 if hvt.rank() == 0 else torch.float32)),
    ):
        try:
            hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     model.named_parameters())
            message = None
        except hvt.ParameterMismatchError as error:
            message = str(error)
        report(f"mismatch_{label}", message=message)


def scenario_verify_replicas() -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvt.verify_replicas(model, optimizer)
    if hvt.rank() == 1:
        with torch.no_grad():
            model[2].bias[1] += 1e-12
    try:
        hvt.verify_replicas(model, optimizer)
        message = None
    except hvt.ReplicaMismatchError as error:
        message = str(error)
    report("verify_replicas", message=message)


def scenario_tensor_collective() -> None:
    workers = tensors()
    report("tensor_collective", **exercise_tensor_collective(
        workers, hvt.rank(), torch.from_numpy, lambda t: t.tolist()))


def scenario_skip_nonfinite() -> None:
    x, y = make_data()
    model = make_model()
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters(), skip_nonfinite=True)
    sums = []
    events = []
    stop_observing = step_observers.add(EventRecorder(events))
    for step in range(3):
        optimizer.zero_grad()
        loss = loss_fn(model, x[rows(step, 0, hvt.rank(), 1)], y[rows(step, 0, hvt.rank(), 1)])
        if step == 1 and hvt.rank() == 1:
            loss = loss * float("nan")
        loss.backward()
        optimizer.step()
        sums.append(checksum(model))
    stop_observing()
    report("skip_nonfinite", checksums=sums, skipped=optimizer.skipped_steps,
           events=events)


def scenario_nonfinite_edges() -> None:
    """One gradient element per case, set on each rank, some near the wire format's
    largest number: the check must raise exactly when the averaged gradient is not
    finite (a bound carried in the allreduce settles most cases; otherwise the check
    sums the averaged gradients, and reads them one by one when that sum is not
    finite)."""
    large = 0.75 * torch.finfo(torch.float32).max
    cases = {  # name: (rank 0's value, rank 1's value, compression)
        "small": (1.0, -2.0, None), "overflow": (large, large, None),
        "cancel": (large, -large, None), "one_large": (large, 1.0, None),
        "nan": (0.0, float("nan"), None), "fp16_overflow": (6e4, 6e4, "fp16"),
    }
    outcomes = {}
    for case, (*values, compression) in cases.items():
        model = torch.nn.Linear(3, 2)
        optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                             model.named_parameters(), compression=compression)
        model(torch.ones(1, 3)).sum().backward()
        with torch.no_grad():
            model.weight.grad[1, 2] = values[hvt.rank()]
        try:
            optimizer.step()
            message = None
        except hvt.NonFiniteGradientError as error:
            message = str(error)
        outcomes[case] = {
            "message": message, "averaged": float(model.weight.grad[1, 2]),
            "finite": all(bool(p.grad.isfinite().all()) for p in model.parameters()),
            # whether the reduced L2 bound settled it, without reading the gradients
            "bound_sufficed": optimizer._bound_proves_finite()}
    # After the user's own synchronize() the gradients may be changed in place (unscaled,
    # clipped) before step(): the bound no longer describes them, so they are read.
    model = torch.nn.Linear(3, 2)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         model.named_parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.synchronize()
    with torch.no_grad():
        model.weight.grad[1, 2] = float("inf")
    try:
        with optimizer.skip_synchronize():
            optimizer.step()
        changed = None
    except hvt.NonFiniteGradientError as error:
        changed = str(error)
    report("nonfinite_edges", outcomes=outcomes, changed_after_synchronize=changed)


def scenario_checkpoint() -> None:
    path = OUT / "checkpoint.pt"
    x, y = make_data()

    def build(seed):
        model = make_model(seed=seed)
        optimizer = hvt.DistributedOptimizer(make_optimizer("adam", model.parameters()),
                                             model.named_parameters())
        scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=4,
                                            steps_per_epoch=2, base_batch_size=4,
                                            warmup_epochs=2)
        hvt.broadcast_state(model, optimizer, scheduler)
        return model, optimizer, scheduler

    def run(model, optimizer, scheduler, steps, lrs):
        for step in steps:
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            loss_fn(model, x[rows(step, 0, hvt.rank(), 1)],
                    y[rows(step, 0, hvt.rank(), 1)]).backward()
            optimizer.step()
            scheduler.step()

    model, optimizer, scheduler = build(seed=1)
    straight_lrs: list[float] = []
    run(model, optimizer, scheduler, range(3), straight_lrs)
    hvt.save_checkpoint(path, model, optimizer, scheduler, step=3, note="after 3 steps")
    run(model, optimizer, scheduler, range(3, 8), straight_lrs)
    straight = checksum(model)

    # A failure in the middle of writing the next checkpoint leaves the last one intact.
    real_save = torch.save

    def torn_save(obj, file):
        file.write(b"partial bytes of a checkpoint")
        raise OSError("disk full (injected)")

    torch.save = torn_save
    try:
        hvt.save_checkpoint(path, model, optimizer, scheduler, step=8)
        torn_error = None
    except RuntimeError as error:
        torn_error = str(error)
    finally:
        torch.save = real_save

    model, optimizer, scheduler = build(seed=2 + hvt.rank())
    extra = hvt.load_checkpoint(path, model, optimizer, scheduler)
    resumed_lrs = straight_lrs[:3]
    run(model, optimizer, scheduler, range(extra["step"], 8), resumed_lrs)
    report("checkpoint", straight=straight, resumed=checksum(model), extra=extra,
           straight_lrs=straight_lrs, resumed_lrs=resumed_lrs, torn_error=torn_error,
           leftovers=sorted(p.name for p in OUT.glob(".checkpoint.pt.*")))

    try:
        hvt.load_checkpoint(OUT / "missing.pt", model)
        missing_error = None
    except RuntimeError as error:
        missing_error = str(error)
    report("checkpoint_missing", error=missing_error)


def scenario_grad_scaler(name: str, shard_state: bool = False) -> None:
    x, y = make_data(dtype=torch.float32)
    model = make_model(dtype=torch.float32)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters(), shard_state=shard_state)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(3):
        optimizer.zero_grad()
        part = rows(step, 0, hvt.rank(), 1)
        scaler.scale(loss_fn(model, x[part], y[part])).backward()
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()
    save(name, parameters(model))
    report(name, checksum=checksum(model), scale=scaler.get_scale())


def scenario_metrics_and_sampler() -> None:
    averaged = hvt.average_metrics({"loss": 1.0 + hvt.rank(), "accuracy":
                                    torch.tensor(0.25 * hvt.rank())})
    try:
        hvt.average_metrics({"loss": 1.0} if hvt.rank() == 0 else {"los": 1.0})
        key_error = None
    except ValueError as error:
        key_error = str(error)
    sampler = hvt.distributed_sampler(list(range(10)), seed=3)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    report("metrics", averaged=averaged, key_error=key_error, sampler=epochs,
           uneven=_uneven_evaluation())


def _uneven_evaluation() -> dict:
    """Evaluate a fixed linear model on 21 examples shared without repeats (11 + 10):
    the examples seen, and the loss and accuracy averaged with and without weights."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(21, 3, generator=generator, dtype=torch.float64)
    y = (x.sum(1) > 0).long()
    model = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.3, -0.2, 0.1], [-0.1, 0.4, 0.2]],
                                        dtype=torch.float64))
        model.bias.zero_()
    sampler = hvt.distributed_sampler(list(range(21)), seed=1, pad=False)
    sampler.set_epoch(2)
    mine = list(sampler)
    with torch.no_grad():
        logits = model(x[mine])
    metrics = {"loss": torch.nn.functional.cross_entropy(logits, y[mine]).item(),
               "accuracy": (logits.argmax(1) == y[mine]).double().mean().item()}
    return {"indices": mine, "length": len(sampler),
            "weighted": hvt.average_metrics(metrics, examples=len(sampler)),
            "unweighted": hvt.average_metrics(metrics)}


def scenario_join_uneven(name: str, **wrapping) -> None:
    """Uneven training shares: rank 0 has JOIN_STEPS[0] batches, rank 1 fewer; each
    calls join() when its data ends, then both take the state of the last to join.
    ``wrapping``: DistributedOptimizer's arguments (the path the gradients take)."""
    x, y = make_data()
    model = make_model()
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters(), **wrapping)
    train_uneven_share(hvt.rank(), model, optimizer, x, y)
    last = hvt.join()
    hvt.broadcast_state(model, optimizer, root_rank=last)
    report(name, last=last, steps=optimizer.steps_taken)
    save(name, parameters(model))


def scenario_join_sharded(name: str, **sharding) -> None:
    """Uneven shares with a sharded optimizer: rank 1 joins after fewer steps; rank 0's
    next step is refused, saying why, and rank 0 then joins too."""
    x, y = make_data()
    model = make_model()
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters(), **sharding)
    error = None
    try:
        train_uneven_share(hvt.rank(), model, optimizer, x, y)
    except RuntimeError as refused:
        error = str(refused)
    hvt.join()
    report(name, error=error)


def scenario_horovod_api() -> None:
    """Horovod's own names, called through hvdtrain's module as a Horovod script would."""
    hvt.barrier()
    model = make_model(seed=40 + hvt.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hvt.broadcast_parameters(model.state_dict(), root_rank=0)
    hvt.broadcast_optimizer_state(optimizer, root_rank=0)
    broadcast_checksum = checksum(model)
    mine = torch.arange(4, dtype=torch.float64) + 10 * hvt.rank()
    summed = hvt.grouped_allreduce([mine, 2 * mine], op=hvt.Sum)
    scattered = hvt.reducescatter(mine, op=hvt.Sum)
    exchanged, _ = hvt.alltoall(mine, torch.tensor([2, 2], dtype=torch.int32))
    handle = hvt.allreduce_async(mine, op=hvt.Max, name="horovod_api.max")
    largest = hvt.synchronize(handle)
    wrapped = hvt.DistributedOptimizer(optimizer, model.named_parameters())
    x, y = make_data()
    loss_fn(model, x[:4], y[:4]).backward()
    wrapped.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped.step()  # Horovod warns here; so do we
    report("horovod_api", checksum=broadcast_checksum, summed=[t.tolist() for t in summed],
           scattered=scattered.tolist(), exchanged=exchanged.tolist(),
           largest=largest.tolist(), cross=[hvt.cross_rank(), hvt.cross_size()],
           controllers=[hvt.mpi_enabled(), hvt.gloo_enabled()],
           warnings=[str(warning.message) for warning in caught])


def scenario_sharded_checkpoint() -> None:
    """AdamW, sharded, 3 steps (constant rate) then a checkpoint; the run goes on 3 more
    steps, and an unsharded optimizer resumes from the file for the same 3 steps; its
    checkpoint is then resumed sharded again. The test compares the file with one
    process's optimizer state and the resumed runs with the uninterrupted one."""
    x, y = make_data()
    folder = OUT / "sharded_checkpoint"
    folder.mkdir(exist_ok=True)

    def build(shard: bool):
        model = make_model(seed=123 if hvt.rank() == 0 else 999)
        return model, hvt.DistributedOptimizer(make_optimizer("adamw", model.parameters()),
                                               model.named_parameters(), shard_state=shard)

    def steps(model, optimizer, first: int, count: int) -> None:
        for step in range(first, first + count):
            optimizer.zero_grad()
            part = rows(step, 0, hvt.rank(), 1)
            loss_fn(model, x[part], y[part]).backward()
            optimizer.step()

    model, optimizer = build(True)
    hvt.broadcast_state(model, optimizer)
    steps(model, optimizer, 0, 3)
    hvt.save_checkpoint(folder / "sharded.pt", model, optimizer)
    steps(model, optimizer, 3, 3)
    straight = parameters(model)
    unsharded_model, unsharded = build(False)
    hvt.load_checkpoint(folder / "sharded.pt", unsharded_model, unsharded)
    steps(unsharded_model, unsharded, 3, 3)
    hvt.save_checkpoint(folder / "unsharded.pt", unsharded_model, unsharded)
    resharded_model, resharded = build(True)
    hvt.load_checkpoint(folder / "unsharded.pt", resharded_model, resharded)
    whole, again = unsharded.state_dict(), resharded.state_dict()
    state_difference = max(
        (whole["state"][i][key] - again["state"][i][key]).abs().max().item()
        for i in whole["state"] for key in whole["state"][i])
    hvt.verify_replicas(resharded_model, resharded)  # gathers the whole state to compare
    report("sharded_checkpoint", state_difference=state_difference,
           state_sizes=sorted({v.numel() for state in resharded.state.values()
                               for v in state.values() if v.dim() > 0}))
    save("sharded_checkpoint_straight", straight)
    save("sharded_checkpoint_resumed", parameters(unsharded_model))


def scenario_sharded_refusals() -> None:
    """What shard_state=True refuses, each with its message."""
    model = make_model()
    errors = {}

    def attempt(case: str, action) -> None:
        try:
            action()
            errors[case] = None
        except Exception as error:
            errors[case] = f"{type(error).__name__}: {error}"

    def sharded(optimizer=None, **settings):
        return hvt.DistributedOptimizer(optimizer or make_optimizer("sgd", model.parameters()),
                                        model.named_parameters(), shard_state=True, **settings)

    attempt("lbfgs", lambda: sharded(torch.optim.LBFGS(model.parameters())))
    attempt("adasum", lambda: sharded(op=hvt.Adasum))
    optimizer = sharded()
    attempt("fingerprint", lambda: hvt.state_fingerprint(model, optimizer))
    x, y = make_data()

    def step() -> None:
        optimizer.zero_grad()
        part = rows(0, 0, hvt.rank(), 1)
        loss_fn(model, x[part].float(), y[part]).backward()
        optimizer.step()

    def torch_clip_with_sliced_gradients() -> None:
        sliced_model = make_model()
        sliced = hvt.DistributedOptimizer(make_optimizer("sgd", sliced_model.parameters()),
                                          sliced_model.named_parameters(), shard_gradients=True)
        part = rows(0, 0, hvt.rank(), 1)
        loss_fn(sliced_model, x[part], y[part]).backward()
        sliced.synchronize()
        torch.nn.utils.clip_grad_norm_(sliced_model.parameters(), 0.05)
        with sliced.skip_synchronize():
            sliced.step()

    attempt("torch_clip_sliced", torch_clip_with_sliced_gradients)
    attempt("overlap_sliced", lambda: hvt.DistributedOptimizer(
        make_optimizer("sgd", model.parameters()), model.named_parameters(),
        shard_gradients=True, overlap=True))
    model.float()  # the parameters leave the float64 buffer they were sharded in
    attempt("converted", step)
    attempt("closure", lambda: optimizer.step(lambda: 0.0))
    report("sharded_refusals", errors=errors)


def scenario_sharded_nonfinite(name: str, **sharding) -> None:
    """A NaN in rank 1's loss at step 1: skipped on both ranks alike with skip_nonfinite,
    an error naming the parameter on both without."""
    x, y = make_data()
    outcomes = {}
    for skip in (True, False):
        model = make_model()
        optimizer = hvt.DistributedOptimizer(make_optimizer("adamw", model.parameters()),
                                             model.named_parameters(), **sharding,
                                             skip_nonfinite=skip)
        try:
            for step in range(3):
                optimizer.zero_grad()
                part = rows(step, 0, hvt.rank(), 1)
                loss = loss_fn(model, x[part], y[part])
                if step == 1 and hvt.rank() == 1:
                    loss = loss * float("nan")
                loss.backward()
                optimizer.step()
            outcomes[str(skip)] = {"skipped": optimizer.skipped_steps,
                                   "fingerprint": checksum(model)}
        except hvt.NonFiniteGradientError as error:
            outcomes[str(skip)] = {"error": str(error)}
    report(name, outcomes=outcomes)


def main() -> None:
    hvt.init()
    torch.set_num_threads(1)
    trainings = {
        "sgd": dict(kind="sgd"),
        "adam": dict(kind="adam"),
        "sgd_accumulate": dict(kind="sgd", passes=2, average_aggregated_gradients=True),
        "sgd_accumulate4": dict(kind="sgd", passes=4, average_aggregated_gradients=True),
        "adam_accumulate": dict(kind="adam", passes=2, average_aggregated_gradients=True),
        "sgd_accumulate_horovod": dict(kind="sgd", passes=2, divide_loss=True),
        "sgd_groups": dict(kind="sgd", groups=2),
        "sgd_predivide": dict(kind="sgd", gradient_predivide_factor=2.0),
        "sgd_overlap": dict(kind="sgd", overlap=True),
        "adam_accumulate_overlap": dict(kind="adam", passes=2, overlap=True,
                                        average_aggregated_gradients=True),
        "sgd_fp16": dict(kind="sgd", dtype=torch.float32, compression="fp16"),
        "sgd_bf16": dict(kind="sgd", dtype=torch.float32, compression="bf16"),
        "sgd_float32": dict(kind="sgd", dtype=torch.float32),
        # bfloat16 on the wire, reduced by Horovod (patch 0011): per tensor, and sharded
        # (and, derived below, reduce-scattered)
        "sgd_bf16_overlap": dict(kind="sgd", dtype=torch.float32, compression="bf16",
                                 overlap=True),
        "sgd_bf16_sharded": dict(kind="sgd", dtype=torch.float32, compression="bf16",
                                 shard_state=True),
        # bfloat16 parameters and gradients, every path
        "sgd_bfloat16": dict(kind="sgd", dtype=torch.bfloat16),
        "sgd_bfloat16_overlap": dict(kind="sgd", dtype=torch.bfloat16, overlap=True),
        "adamw_bfloat16": dict(kind="adamw", dtype=torch.bfloat16),
        "adamw_bfloat16_sharded": dict(kind="adamw", dtype=torch.bfloat16, shard_state=True),
        "adamw": dict(kind="adamw"),
        "adamw_clip": dict(kind="adamw", clip=0.05),
        "sgd_sharded": dict(kind="sgd", shard_state=True),
        "adamw_sharded": dict(kind="adamw", shard_state=True),
        "sgd_sharded_accumulate": dict(kind="sgd", passes=2, average_aggregated_gradients=True,
                                       shard_state=True),
        "adamw_sharded_accumulate": dict(kind="adamw", passes=2, shard_state=True,
                                         average_aggregated_gradients=True),
        "sgd_sharded_accumulate_horovod": dict(kind="sgd", passes=2, divide_loss=True,
                                               shard_state=True),
        "sgd_sharded_clip": dict(kind="sgd", clip=0.05, shard_state=True),
        "adamw_sharded_clip": dict(kind="adamw", clip=0.05, shard_state=True),
        "sgd_sharded_fp16": dict(kind="sgd", dtype=torch.float32, compression="fp16",
                                 shard_state=True),
        "adamw_sharded_accumulate_clip": dict(kind="adamw", passes=2, clip=0.05,
                                              average_aggregated_gradients=True,
                                              shard_state=True),
        "adamw_sharded_torch_clip": dict(kind="adamw", clip=0.05, clip_with="torch",
                                         shard_state=True),
        "sgd_sharded_overlap": dict(kind="sgd", overlap=True, shard_state=True),
        "adamw_sharded_relinked": dict(kind="adamw", replace_data=True, shard_state=True),
    }
    # ZeRO stage 2: each stage 1 training with the gradients reduce-scattered too, but for
    # the two that stage 2 refuses (torch's clip after synchronize(), overlap).
    trainings.update({
        name.replace("_sharded", "_grad_sharded"): {
            **{key: value for key, value in settings.items() if key != "shard_state"},
            "shard_gradients": True}
        for name, settings in list(trainings.items())
        if settings.get("shard_state") and name not in ("adamw_sharded_torch_clip",
                                                        "sgd_sharded_overlap")})
    run_scenarios(hvt.rank, {
        **{name: functools.partial(train, name, **settings)
           for name, settings in trainings.items()},
        "runtime_defaults": scenario_runtime_defaults,
        "broadcast_state": scenario_broadcast_state,
        "mismatch": scenario_mismatch,
        "verify_replicas": scenario_verify_replicas,
        "skip_nonfinite": scenario_skip_nonfinite,
        "tensor_collective": scenario_tensor_collective,
        "nonfinite_edges": scenario_nonfinite_edges,
        "checkpoint": scenario_checkpoint,
        "grad_scaler": functools.partial(scenario_grad_scaler, "grad_scaler"),
        "grad_scaler_sharded": functools.partial(scenario_grad_scaler, "grad_scaler_sharded",
                                                 shard_state=True),
        "metrics": scenario_metrics_and_sampler,
        "horovod_api": scenario_horovod_api,
        "sharded_checkpoint": scenario_sharded_checkpoint,
        "sharded_refusals": scenario_sharded_refusals,
        "sharded_nonfinite": functools.partial(scenario_sharded_nonfinite, "sharded_nonfinite",
                                               shard_state=True),
        "grad_sharded_nonfinite": functools.partial(
            scenario_sharded_nonfinite, "grad_sharded_nonfinite", shard_gradients=True),
        "join_uneven": functools.partial(scenario_join_uneven, "join_uneven"),
        "join_sharded": functools.partial(scenario_join_sharded, "join_sharded",
                                          shard_state=True),
        "join_grad_sharded": functools.partial(scenario_join_sharded, "join_grad_sharded",
                                               shard_gradients=True),
        "join_uneven_overlap": functools.partial(scenario_join_uneven, "join_uneven_overlap",
                                                 overlap=True),
        "join_uneven_groups": functools.partial(scenario_join_uneven, "join_uneven_groups",
                                                groups=2),
    })
    hvt.shutdown()


if __name__ == "__main__":
    main()
