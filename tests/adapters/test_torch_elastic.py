"""hvdtrain.adapters.torch.elastic in real Horovod elastic jobs (Gloo, one machine).

Each worker gets its own host name (host-a, host-b, host-c) through hvdtrain.local_hosts
(an ``ssh`` stand-in early in PATH that runs the command here): Horovod blacklists
the host of a failed worker, so workers sharing ``localhost`` could not lose one and
go on. One launch
per scenario of tests/workers/torch_elastic_train.py, checked against the closed-form
schedule and the data set:

- shrink: 3 workers, rank 2 killed mid-epoch; training goes on as 2 from the last
  commit, the rate follows the rule for the new k, every sample of each epoch is
  consumed once by the committed steps, the replicas end identical, the job exits 0.
- grow: 2 workers, a third host appears; the job goes on as 3, the same way.
"""

import pytest
from elastic_jobs import check_grow, check_shrink

pytestmark = pytest.mark.timeout(300)
WORKER = "torch_elastic_train.py"


def test_a_killed_worker_leaves_the_others_training_with_the_rule_for_their_number(tmp_path):
    check_shrink(WORKER, tmp_path)


def test_a_worker_added_joins_with_the_rule_for_the_new_number(tmp_path):
    check_grow(WORKER, tmp_path)
