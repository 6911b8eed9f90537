"""Running jobs: the other wing of hvdtrain, beside the training rules.

The training rules (the core modules of :mod:`hvdtrain` and the adapters) decide what
every rank computes; this package starts ranks and reports on them: :mod:`.launch`
(a script on N ranks under ``horovodrun``, each rank's exit code and output),
:mod:`.local_hosts` (several host names on one machine, for elastic jobs and demos),
:mod:`.slurm` (an allocation's host list), :mod:`.ray` (a Horovod job on a Ray
cluster), :mod:`.cli` (the ``hvdtrain`` command), with :mod:`.doctor`, :mod:`.plot`,
and what the launcher runs on each rank (:mod:`._rank_entry`, :mod:`._smoke`).
"""
