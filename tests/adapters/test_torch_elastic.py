"""hvdtrain.adapters.torch.elastic in real Horovod elastic jobs (Gloo, one machine).

Each worker gets its own host name (host-a, host-b, host-c) through hvdtrain.jobs.local_hosts
(an ``ssh`` stand-in early in PATH that runs the command here): Horovod blacklists
the host of a failed worker, so workers sharing ``localhost`` could not lose one and
go on. One launch
per scenario of tests/workers/torch_elastic_train.py, checked against the closed-form
schedule and the data set:

- shrink: 3 workers, rank 2 killed mid-epoch; training goes on as 2 from the last
  commit, the rate follows the rule for the new k, every sample of each epoch is
  consumed once by the committed steps, the replicas end identical, the job exits 0.
- lose-rank-0: the same with rank 0 killed.
- grow: 2 workers, a third host appears; the job goes on as 3, the same way.
- sharded shrink and grow: the same with ``DistributedOptimizer(shard_state=True)`` (the
  shrink with ``shard_gradients=True``, ZeRO stage 2) and SGD with momentum, whose
  state each reset re-shards for the new number of workers; the final weights equal
  one process replaying the steps that stand.
- lose-two: 5 workers (oversubscribed here, marked ``scale``), ranks 3 and 4 killed
  together; the job goes on as 3, the same way, its ZeRO-2 state re-sharded from shards
  of 1 to shards of 2, 2 and 1.
- the step timing (1 s windows) before and after the shrink's reset.
- below-min: 3 workers with ``--min-np 3``, one killed: the job ends non-zero within
  the elastic timeout plus 60 s and leaves no worker behind, whether the launcher stops
  the survivors (the stand-in passes its termination on) or not (a stand-in that
  leaves them: they end themselves, saying why).

The same scenarios over real ssh are in tests/test_ssh_cluster.py.
"""

import pytest
from elastic_jobs import (
    check_below_min,
    check_grow,
    check_lose_two,
    check_replay,
    check_shrink,
)

from hvdtrain.step_timing import METRICS_FILE_VARIABLE, REPORT_SECONDS_VARIABLE
from hvdtrain.stragglers import read_records

pytestmark = pytest.mark.timeout(300)
WORKER = "torch_elastic_train.py"


def test_a_killed_worker_leaves_the_others_training_with_the_rule_for_their_number(tmp_path):
    check_shrink(WORKER, tmp_path)


def test_a_worker_added_joins_with_the_rule_for_the_new_number(tmp_path):
    check_grow(WORKER, tmp_path)


def test_a_sharded_state_is_resharded_when_a_worker_is_lost(tmp_path):
    """With the gradients sharded too (stage 2; the grow below shards the state only)."""
    check_shrink(WORKER, tmp_path, check=check_replay, HVDTRAIN_TEST_SHARDED="gradients")


@pytest.mark.scale
def test_five_workers_losing_two_go_on_as_three_with_their_state_resharded(tmp_path):
    check_lose_two(WORKER, tmp_path, check=check_replay, HVDTRAIN_TEST_SHARDED="gradients")


def test_a_sharded_state_is_resharded_when_a_worker_joins(tmp_path):
    check_grow(WORKER, tmp_path, check=check_replay, HVDTRAIN_TEST_SHARDED="1")


def test_the_step_timing_goes_on_after_a_reset_with_the_workers_left(tmp_path):
    """Short windows, so that the ranks exchange their times before and after the reset:
    the reset starts the window anew on the survivors, who go on exchanging as 2."""
    metrics = tmp_path / "run.jsonl"
    check_shrink(WORKER, tmp_path, **{REPORT_SECONDS_VARIABLE: "0.3",
                                      METRICS_FILE_VARIABLE: str(metrics)})
    records = list(read_records(metrics))
    sizes = [record["world_size"] for record in records]
    assert sizes[0] == 3 and sizes[-1] == 2 and sizes == sorted(sizes, reverse=True), sizes
    assert all(len(record["ranks"]) == record["world_size"] for record in records)
    def hosts(size: int) -> set[str]:  # the launcher's names for them
        return {entry["host"] for record in records if record["world_size"] == size
                for entry in record["ranks"]}

    assert hosts(3) == {"host-a", "host-b", "host-c"}
    assert len(hosts(2)) == 2 and hosts(2) < hosts(3)  # the killed worker's host is gone


def test_losing_rank_0_leaves_the_others_training(tmp_path):
    check_shrink(WORKER, tmp_path, victim=0)


def test_a_job_below_min_np_ends_and_leaves_no_worker(tmp_path):
    check_below_min(WORKER, tmp_path)


def test_workers_their_launcher_does_not_stop_end_themselves_below_min_np(tmp_path):
    check_below_min(WORKER, tmp_path, leaky=True)
