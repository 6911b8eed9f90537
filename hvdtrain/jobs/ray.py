"""Run an hvdtrain training function as a Horovod job on a Ray cluster.

Horovod's own Ray integration (``horovod.ray.RayExecutor``) starts one actor per worker
and Gloo between them; a function that trains with any hvdtrain adapter runs there
unmodified. :func:`run` adds what ``horovodrun`` gives hvdtrain's jobs and Ray alone does
not: the first failure ends the whole job at once with an error naming the rank (under
Ray a worker whose function raised stays alive, and the others would wait for it in
their next collective), a worker whose process died is named too, and when the
collective watchdog (:mod:`hvdtrain.watchdog`) ends a stalled worker its report reaches
the error. With ``min_workers`` the job is elastic (Horovod's elastic driver on Ray;
the training function uses ``hvt.elastic`` / ``hvk.elastic`` as under ``horovodrun``).

Example::

    import ray
    import hvdtrain.jobs.ray

    def train(epochs):
        import hvdtrain.adapters.torch as hvt
        hvt.init()
        ...
        return hvt.rank(), final_loss

    ray.init(address="auto")                      # or ray.init() for a local cluster
    results = hvdtrain.jobs.ray.run(train, num_workers=4, kwargs={"epochs": 3})

Needs the ``ray`` extra (``pip install hvdtrain[ray]``); README.md, "On a Ray cluster".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hvdtrain import watchdog
from hvdtrain.jobs.launch import LaunchError
from hvdtrain.validation import require_positive_int

__all__ = ["RankFailed", "failure_message", "run"]

Result = TypeVar("Result")
_START_TIMEOUT_S = 60
# Ray forwards the workers' output to the driver asynchronously, from their log files;
# a driver that shuts Ray down at once loses their last lines (a training script's
# final summary). This much time after the job lets them arrive.
_OUTPUT_GRACE_S = 1.0


class RankFailed(LaunchError):
    """A worker of a Ray job failed; ``rank`` is the one that did."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


def failure_message(rank: int, size: int, cause: str, process_died: bool,
                    watchdog_report: str | None = None) -> str:
    """What :func:`run` raises when rank ``rank`` of ``size`` failed with ``cause``
    (``process_died``: its process ended, rather than its function raising)."""
    if watchdog_report:
        return (f"hvdtrain: rank {rank} of {size} was ended by the collective watchdog: "
                f"{watchdog_report.removeprefix('hvdtrain: ')} The job was stopped.")
    if process_died:
        return (f"hvdtrain: rank {rank} of {size} died (its process ended: killed, out of "
                f"memory, or its node was lost); the job was stopped. Ray says: {cause}")
    return f"hvdtrain: rank {rank} of {size} failed: {cause}; the job was stopped."


def run(train: Callable[..., Result], *, num_workers: int | None = None,
        min_workers: int | None = None, max_workers: int | None = None,
        args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        cpus_per_worker: int = 1, use_gpu: bool = False,
        env: Mapping[str, str] | None = None, timeout_s: float | None = None,
        elastic_timeout_s: int = 600, nics: Sequence[str] | None = None) -> list[Result]:
    """Run ``train(*args, **kwargs)`` on every worker of a Horovod job on the Ray cluster
    this process is connected to (``ray.init()``); the workers' return values, in rank
    order (elastic: the workers that finished).

    Args:
        train: the training function; it calls an adapter's ``init()`` itself. It must
            be importable or picklable by Ray (a module-level function).
        num_workers: a fixed-size job of this many workers.
        min_workers, max_workers: an elastic job instead (Horovod's elastic driver on
            Ray; Gloo): it starts with as many workers as the cluster has slots (up to
            ``max_workers``), goes on while at least ``min_workers`` are left, and
            ``train`` must use ``hvt.elastic.run`` (or ``hvk.elastic``).
        cpus_per_worker, use_gpu: the resources each worker reserves.
        env: environment variables for the workers (e.g. hvdtrain's settings).
        timeout_s: stop a fixed-size job and raise if it has not finished by then (an
            elastic job ends by Horovod's elastic driver instead: ``elastic_timeout_s``).
        elastic_timeout_s: how long an elastic job waits for ``min_workers``.
        nics: the network interfaces the workers' Gloo uses (``horovodrun
            --network-interfaces``); by default Horovod finds one every node shares by
            running probe tasks on each node.

    Raises:
        RankFailed: a worker raised, died, or was ended by the collective watchdog;
            the other workers are stopped first.
        LaunchError: the job did not finish within ``timeout_s``.
    """
    import ray
    from horovod.ray import RayExecutor

    _refuse_bad_arguments(num_workers, min_workers, max_workers, cpus_per_worker, timeout_s)
    if not ray.is_initialized():
        raise RuntimeError("hvdtrain.jobs.ray.run needs a Ray cluster: call ray.init() first "
                           "(ray.init(address='auto') to join a running one)")
    settings = RayExecutor.create_settings(timeout_s=_START_TIMEOUT_S,
                                           nics=set(nics) if nics else None)
    args, kwargs, env = list(args), dict(kwargs or {}), dict(env or {})
    if min_workers is not None:
        executor = RayExecutor(settings, min_workers=min_workers, max_workers=max_workers,
                               cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                               elastic_timeout=elastic_timeout_s)
        executor.start(extra_env_vars=env)
        results = executor.run(train, args=args, kwargs=kwargs)
    else:
        executor = RayExecutor(settings, num_workers=num_workers,
                               cpus_per_worker=cpus_per_worker, use_gpu=use_gpu)
        results = _run_fixed_size(executor, train, args, kwargs, env, timeout_s)
    time.sleep(_OUTPUT_GRACE_S)
    return results


def _refuse_bad_arguments(num_workers: int | None, min_workers: int | None,
                          max_workers: int | None, cpus_per_worker: int,
                          timeout_s: float | None) -> None:
    if (num_workers is None) == (min_workers is None):
        raise ValueError("pass either num_workers (a fixed-size job) or min_workers (an "
                         f"elastic job), got num_workers={num_workers!r} and "
                         f"min_workers={min_workers!r}")
    require_positive_int("cpus_per_worker", cpus_per_worker)
    if num_workers is not None:
        require_positive_int("num_workers", num_workers)
    else:
        require_positive_int("min_workers", min_workers)
        if max_workers is not None and max_workers < min_workers:
            raise ValueError(f"max_workers={max_workers} is below min_workers={min_workers}")
        if timeout_s is not None:
            raise ValueError("timeout_s bounds fixed-size jobs only; an elastic job ends when "
                             "fewer than min_workers are left for elastic_timeout_s")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None, got {timeout_s!r}")


def _run_fixed_size(executor: Any, train: Callable[..., Result], args: list, kwargs: dict,
                    env: dict, timeout_s: float | None) -> list[Result]:
    """Start ``executor``'s workers, run ``train`` on each, watch them all; whatever
    happens, every worker is killed and the executor shut down before returning."""
    import ray

    reports = ray.remote(num_cpus=0)(_WatchdogReports).remote()
    workers: list = []
    try:
        executor.start(extra_env_vars=env)
        workers = list(executor.adapter.workers)
        pending = {worker.execute.remote(_as_rank(train, args, kwargs, rank, reports)): rank
                   for rank, worker in enumerate(workers)}
        return _gather(pending, len(workers), reports, timeout_s)
    finally:
        for actor in (*workers, reports):
            ray.kill(actor)
        executor.shutdown()


class _WatchdogReports:
    """A Ray actor the workers' watchdogs hand their report to before they end."""

    def __init__(self) -> None:
        self.reports: dict[int, str] = {}

    def record(self, rank: int, report: str) -> None:
        self.reports.setdefault(rank, report)

    def of(self, rank: int) -> str | None:
        return self.reports.get(rank)


def _as_rank(train: Callable[..., Result], args: Sequence[Any], kwargs: Mapping[str, Any],
             rank: int, reports: Any) -> Callable[[Any], Result]:
    """What a worker actor executes: ``train`` with the watchdog's reports forwarded."""

    def execute(_executable: Any) -> Result:
        import ray

        def forward(report: str) -> None:
            ray.get(reports.record.remote(rank, report), timeout=10)

        watchdog.forward_reports(forward)
        return train(*args, **kwargs)

    return execute


def _gather(pending: dict, size: int, reports: Any, timeout_s: float | None) -> list:
    import ray

    results: list[Any] = [None] * size
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
        if not done:
            raise LaunchError(f"hvdtrain: the Ray job did not finish within {timeout_s:g} s "
                              f"(ranks {sorted(pending.values())} still running); stopped it")
        rank = pending.pop(done[0])
        try:
            results[rank] = ray.get(done[0])
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if error.cause is not None else error
            raise RankFailed(failure_message(rank, size, f"{type(cause).__name__}: {cause}",
                                             False), rank) from error
        except ray.exceptions.RayActorError as error:
            report = ray.get(reports.of.remote(rank))
            raise RankFailed(failure_message(rank, size, str(error).strip(), True, report),
                             rank) from error
    return results
