"""The ``hvdtrain`` command: ``hvdtrain doctor``, ``schedule``, ``env`` and ``hosts``."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from hvdtrain.schedule import (
    DEFAULT_BASE_BATCH_SIZE,
    DEFAULT_GAMMA,
    DEFAULT_WARMUP_EPOCHS,
    LinearScalingSchedule,
)


def _milestones(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--milestones takes comma-separated epochs such as 30,60,80, got {text!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdtrain", description="Data-parallel training on Horovod: tools."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    doctor = commands.add_parser(
        "doctor", help="check versions, the Horovod build and a 2-process allreduce"
    )
    doctor.add_argument("--timeout", type=float, default=120.0,
                        help="seconds each 2-process smoke run may take (default 120)")

    commands.add_parser(
        "env", help="print `export` lines for hvdtrain's launcher and runtime defaults",
        description="Print an `export NAME=value` line for each of hvdtrain's defaults that "
                    "the environment does not set yet (Horovod's stall check, Open MPI's "
                    "daemon keepalive). Use before launching: eval \"$(hvdtrain env)\"",
    )

    hosts = commands.add_parser(
        "hosts", help="print the Slurm allocation's hosts for horovodrun -H",
        description="Inside an sbatch script or salloc shell, print the allocation's nodes "
                    "and task counts as horovodrun -H takes them (node01:4,node02:4). Use: "
                    'horovodrun -np "$SLURM_NTASKS" -H "$(hvdtrain hosts)" ...',
    )
    hosts.add_argument("--lines", action="store_true",
                       help="one host:slots per line, as a --host-discovery-script prints")

    report = commands.add_parser(
        "report", help="summarise the step timing's records (HVDTRAIN_METRICS_FILE)",
        description="Read the JSON lines rank 0 appends to HVDTRAIN_METRICS_FILE while "
                    "training (one per HVDTRAIN_STRAGGLER_REPORT_SECONDS window) and print "
                    "each rank's compute, wait and reduction per step, and the straggler.",
    )
    report.add_argument("file", help="the metrics file (JSON lines)")
    report.add_argument("--plot", metavar="FILE.png",
                        help="also draw each rank's compute and wait over time (needs "
                             "matplotlib)")

    schedule = commands.add_parser(
        "schedule",
        help="print (and plot) the Goyal et al. linear-scaling + warmup learning rate",
        description="The learning rate per epoch under Goyal et al. 2017's linear scaling "
                    "rule and gradual warmup, as hvdtrain's schedulers apply it.",
    )
    schedule.add_argument("--base-lr", type=float, required=True,
                          help="eta, the learning rate tuned for --base-batch-size")
    schedule.add_argument("--batch-size-per-worker", type=int, required=True)
    schedule.add_argument("--world-size", "--workers", dest="world_size", type=int,
                          required=True, help="number of workers (Horovod's size())")
    schedule.add_argument("--steps-per-epoch", type=int, required=True)
    schedule.add_argument("--epochs", type=int, required=True)
    schedule.add_argument("--base-batch-size", type=int, default=DEFAULT_BASE_BATCH_SIZE)
    schedule.add_argument("--warmup-epochs", type=float, default=DEFAULT_WARMUP_EPOCHS)
    schedule.add_argument("--milestones", type=_milestones, default=(),
                          help="comma-separated epochs at which to multiply by --gamma")
    schedule.add_argument("--gamma", type=float, default=DEFAULT_GAMMA)
    schedule.add_argument("--backward-passes-per-step", type=int, default=1,
                          help="gradient-accumulation steps per optimizer step")
    schedule.add_argument("--plot", metavar="FILE.png",
                          help="also draw the per-step curve to this image (needs matplotlib)")
    return parser


def print_schedule(args: argparse.Namespace) -> int:
    schedule = LinearScalingSchedule(
        base_lr=args.base_lr,
        batch_size_per_worker=args.batch_size_per_worker,
        world_size=args.world_size,
        steps_per_epoch=args.steps_per_epoch,
        base_batch_size=args.base_batch_size,
        warmup_epochs=args.warmup_epochs,
        milestones=args.milestones,
        gamma=args.gamma,
        backward_passes_per_step=args.backward_passes_per_step,
    )
    if args.warmup_epochs > args.epochs:
        raise ValueError(f"warmup_epochs ({args.warmup_epochs:g}) is longer than training "
                         f"(--epochs {args.epochs}): the rate would never reach k*eta; shorten "
                         "--warmup-epochs or train longer")
    rows = schedule.epoch_table(args.epochs)
    print(f"global batch {schedule.global_batch_size} = {args.batch_size_per_worker} per worker"
          f" x {args.world_size} workers x {args.backward_passes_per_step} accumulation steps; "
          f"k = {schedule.scale:g}; target LR k*eta = {schedule.target_lr:g}; "
          f"warmup {schedule.warmup_steps} steps")
    print(f"{'epoch':>5}  {'steps':>13}  {'LR at first step':>16}  {'LR at last step':>16}")
    for row in rows:
        print(f"{row.epoch:>5}  {row.first_step:>6}-{row.last_step:<6}  "
              f"{row.first_lr:>16.6g}  {row.last_lr:>16.6g}")
    if args.plot:
        from hvdtrain.jobs.plot import plot_schedule

        plot_schedule(schedule, args.epochs, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def print_environment() -> int:
    from hvdtrain.runtime import missing_defaults

    for name, value in missing_defaults().items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def print_hosts(lines: bool) -> int:
    from hvdtrain.jobs.slurm import NotInAllocation, allocation_hosts

    try:
        hosts = allocation_hosts()
    except NotInAllocation as error:
        print(f"hvdtrain hosts: error: {error}", file=sys.stderr)
        return 2
    print(hosts.replace(",", "\n") if lines else hosts)
    return 0


def print_report(path: str, plot: str | None) -> int:
    """Print the summary of the metrics file ``path`` (and draw it to ``plot``)."""
    from hvdtrain.jobs.report import plot_step_times, summary
    from hvdtrain.stragglers import read_records

    try:
        records = list(read_records(path))
        print(summary(records))
    except (OSError, ValueError) as error:
        print(f"hvdtrain report: error: {error}", file=sys.stderr)
        return 2
    if plot:
        plot_step_times(records, plot)
        print(f"hvdtrain report: drew {plot}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvdtrain`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from hvdtrain.jobs.doctor import run_doctor

        return run_doctor(timeout=args.timeout)
    if args.command == "env":
        return print_environment()
    if args.command == "hosts":
        return print_hosts(args.lines)
    if args.command == "report":
        return print_report(args.file, args.plot)
    try:
        return print_schedule(args)
    except ValueError as error:
        parser.exit(2, f"hvdtrain schedule: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
