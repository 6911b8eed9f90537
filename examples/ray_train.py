"""examples/torch_train.py as a Horovod job on a Ray cluster, unchanged.

Run on this machine (a local Ray cluster is started and stopped with the script):
       python examples/ray_train.py --workers 2
On a Ray cluster: ``ray start --head`` on one machine, ``ray start --address HEAD:6379``
on each other one, then on any of them:
       python examples/ray_train.py --address auto --workers 8 \\
           --checkpoint /shared/checkpoints/ray_train.pt

Every option after ``--`` goes to torch_train.py (``-- --epochs 20 --resume``). Ray ships
this folder to every worker; hvdtrain.jobs.ray.run starts one Ray actor per worker with
Horovod (Gloo) between them, runs torch_train.main on each, and ends the whole job
naming the rank if one fails. The checkpoint must be on storage every worker can
read (rank 0 writes it; ``--resume`` reads it on every rank).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ray

import hvdtrain.jobs.ray

HERE = Path(__file__).resolve().parent


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None,
                        help="the Ray cluster to join ('auto': the one this machine is in); "
                             "default: start a local one")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=int, default=1)
    parser.add_argument("--checkpoint", type=Path,
                        default=Path("checkpoints/ray_train.pt").resolve())
    argv = sys.argv[1:]
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    return parser.parse_args(ours), theirs


def train(argv: list[str]) -> int:
    """What every worker runs: torch_train.py's main with ``argv``."""
    import torch_train

    return torch_train.main(argv)


def main() -> int:
    args, train_args = parse_args()
    ray.init(address=args.address, runtime_env={
        "working_dir": str(HERE), "env_vars": {"OMP_NUM_THREADS": str(args.cpus_per_worker)}})
    try:
        codes = hvdtrain.jobs.ray.run(train, num_workers=args.workers,
                                 cpus_per_worker=args.cpus_per_worker,
                                 args=[["--checkpoint", str(args.checkpoint), *train_args]])
    except hvdtrain.jobs.ray.RankFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
