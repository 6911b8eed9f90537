"""The hosts of a Slurm allocation, in the form ``horovodrun -H`` takes, framework-free.

Under Slurm, ``srun`` starts the workers itself and needs no host list. ``horovodrun``
(for Gloo, or elastic jobs) does: inside an ``sbatch`` script or ``salloc`` shell,
``hvdtrain hosts`` prints it from the allocation, so that the user never writes
node names::

    horovodrun -np "$SLURM_NTASKS" -H "$(hvdtrain hosts)" --gloo python train.py

Slurm describes the allocation with ``SLURM_JOB_NODELIST`` (compressed, such as
``node[01-03]``, which ``scontrol show hostnames`` expands) and
``SLURM_TASKS_PER_NODE`` (such as ``4(x2),2``: 4 tasks on each of the first two nodes,
then 2).

>>> host_list(["node01", "node02", "node03"], "4(x2),2")
'node01:4,node02:4,node03:2'
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence

NODELIST_VARIABLE = "SLURM_JOB_NODELIST"
TASKS_VARIABLE = "SLURM_TASKS_PER_NODE"
_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class NotInAllocation(RuntimeError):
    """Raised outside a Slurm allocation, or when it cannot be read."""


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` expanded: ``"4(x2),2"`` -> ``[4, 4, 2]``."""
    counts = []
    for item in text.split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if match is None:
            raise NotInAllocation(f"{TASKS_VARIABLE}={text!r} is not a Slurm task count list "
                                  "such as '4(x2),2'")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def host_list(nodes: Sequence[str], tasks: str) -> str:
    """``horovodrun -H``'s ``host:slots,...`` for ``nodes`` (expanded) with ``tasks``
    (``SLURM_TASKS_PER_NODE``)."""
    counts = tasks_per_node(tasks)
    if len(counts) != len(nodes):
        raise NotInAllocation(f"{TASKS_VARIABLE} gives {len(counts)} nodes but "
                              f"{NODELIST_VARIABLE} names {len(nodes)}: {list(nodes)}")
    return ",".join(f"{node}:{count}" for node, count in zip(nodes, counts, strict=True))


def expand_nodelist(nodelist: str) -> list[str]:
    """A compressed node list (``node[01-03]``) as names, by ``scontrol show hostnames``."""
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=30)
    except FileNotFoundError:
        raise NotInAllocation("scontrol not found: run this on a node of the Slurm "
                              "cluster") from None
    if done.returncode != 0:
        raise NotInAllocation(f"scontrol show hostnames {nodelist!r} failed: "
                              f"{done.stderr.strip()}")
    return done.stdout.split()


def allocation_hosts(environ: Mapping[str, str] = os.environ,
                     expand: Callable[[str], list[str]] | None = None) -> str:
    """The current allocation's ``host:slots,...`` (see the module docstring); ``expand``
    turns the compressed node list into names (default :func:`expand_nodelist`)."""
    missing = [name for name in (NODELIST_VARIABLE, TASKS_VARIABLE) if not environ.get(name)]
    if missing:
        raise NotInAllocation(f"not inside a Slurm allocation ({' and '.join(missing)} "
                              "unset): run this in an sbatch script or an salloc shell, "
                              "with --ntasks (-n) given")
    nodes = (expand or expand_nodelist)(environ[NODELIST_VARIABLE])
    return host_list(nodes, environ[TASKS_VARIABLE])
