"""hvdtrain.adapters.keras.elastic: real Horovod elastic jobs with ``model.fit`` (Gloo,
one machine, both of Keras's backends), with the same scenarios and checks as
test_torch_elastic.py (tests/elastic_jobs.py, run by
tests/workers/keras_elastic_train.py); then the pieces in one process.
"""

import keras
import numpy as np
import pytest
from elastic_jobs import check_below_min, check_grow, check_shrink, elastic_job
from harness import single_process
from keras import ops

import hvdtrain.adapters.keras as hvk
from hvdtrain.adapters.keras.elastic import CommitState, ElasticData, KerasState

pytestmark = pytest.mark.timeout(300)
WORKER = "keras_elastic_train.py"
BACKENDS = ["tensorflow", "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fit_goes_on_without_a_killed_worker_at_the_rule_for_the_others(tmp_path, backend):
    check_shrink(WORKER, tmp_path, KERAS_BACKEND=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fit_takes_in_an_added_worker_at_the_rule_for_the_new_number(tmp_path, backend):
    check_grow(WORKER, tmp_path, KERAS_BACKEND=backend)


def test_fit_workers_their_launcher_does_not_stop_end_themselves_below_min_np(tmp_path):
    check_below_min(WORKER, tmp_path, leaky=True, KERAS_BACKEND="tensorflow")


# The pieces, against their definitions (in this process, but for run).

def test_run_retries_from_the_commit_on_a_horovod_failure_and_lets_other_errors_out(tmp_path):
    [report] = [r for r in elastic_job(tmp_path, "keras_elastic_errors.py", "errors",
                                       ["host-a"], 1, 1, KERAS_BACKEND="tensorflow")
                if r["scenario"] == "errors"]
    assert report["recovered"] == {"result": "finished", "calls": 2,
                                   "committed_weights_each_call": [True, True], "size": 1}
    assert report["unknown_error"] == "UnknownError"
    assert report["value_error"] == "ValueError"


def test_a_model_resumed_on_another_number_of_workers_follows_this_jobs_rule():
    """fit(initial_epoch=1) on one worker: k = 4 x 1 / 2 = 2 at epoch 1 of a 2-epoch
    warmup, η + (2η - η) x 1/2, whatever rate the (loaded) optimizer held."""
    report, _ = single_process("keras_resume_single.py")
    assert report["size"] == 1
    assert report["lr"] == pytest.approx(0.05 + 0.05 * 0.5, rel=1e-6)


def shares(data: ElasticData, size: int) -> list[np.ndarray]:
    return [data.share(rank, size) for rank in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("position", [0, 5, 96, 239])
def test_each_step_takes_the_next_samples_of_the_epoch_and_the_padding_is_bounded(size, position):
    data = ElasticData(np.arange(240), np.arange(240), batch_size=4, seed=3)
    data.load_state_dict({"epoch": 1, "position": position})
    rest = np.random.default_rng([3, 1]).permutation(240)[position:]
    parts = shares(data, size)
    assert len({len(part) for part in parts}) == 1  # as many batches on every worker
    steps = -(-len(parts[0]) // 4)
    taken = []
    for step in range(steps):
        batch = np.concatenate([part[step * 4:(step + 1) * 4] for part in parts])
        # Step j of all workers consumes the next 4 x size samples of what is left.
        expected = rest[step * 4 * size:(step + 1) * 4 * size]
        assert set(expected) <= set(batch), (step, batch, expected)
        taken.extend(batch)
    assert sorted(set(taken)) == sorted(rest)
    assert len(taken) - len(rest) <= size - 1


def test_the_data_counts_steps_and_starts_epochs_over():
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    data = ElasticData(x, y, batch_size=3, shuffle=False)
    assert len(data) == 4  # one worker: 3 + 3 + 3 + 1
    batch_x, batch_y = data[3]
    assert batch_y.tolist() == [9] and batch_x.tolist() == [[18.0, 19.0]]
    for _ in range(2):
        data.record_batch()
    assert data.state_dict() == {"epoch": 0, "position": 6}
    data.on_epoch_end()
    assert len(data) == 2 and data[0][1].tolist() == [6, 7, 8]
    data.set_epoch(1)
    assert data.state_dict() == {"epoch": 1, "position": 0} and len(data) == 4
    with pytest.raises(IndexError):
        data[4]
    shuffled = ElasticData(x, y, batch_size=3, seed=0)
    orders = [shuffled.share(0, 1).tolist()]
    shuffled.set_epoch(1)
    orders.append(shuffled.share(0, 1).tolist())
    assert orders[0] != orders[1] and sorted(orders[0]) == list(range(10))


def test_bad_data_and_state_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="same number of samples"):
        ElasticData(np.zeros((4, 2)), np.zeros(3), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ElasticData(np.zeros((4, 2)), batch_size=0)
    model = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not built"):
        KerasState(model)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not compiled"):
        KerasState(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(TypeError, match="ElasticData"):
        KerasState(model, data=[1, 2])
    with pytest.raises(TypeError, match="LinearScalingWarmup"):
        KerasState(model, warmup=keras.callbacks.History())
    with pytest.raises(TypeError, match="KerasState"):
        CommitState(model)


def test_a_restore_returns_weights_optimizer_and_progress_to_the_last_save():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    data = ElasticData(np.zeros((8, 2)), np.zeros(8), batch_size=2)
    state = KerasState(model, data=data, step=3)
    saved = [ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]
    for variable in model.variables + model.optimizer.momentums:
        variable.assign(variable + 1.0)
    data.record_batch()
    state.step = 4
    state.restore()
    restored = [ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(saved, restored, strict=True))
    assert data.position == 0 and state.step == 3 and state.epoch == 0


def test_the_warmup_resized_mid_training_follows_the_rule_in_epochs_and_corrects_momentum():
    """14 steps of 3 workers x 4 samples (0.7 of a 240-sample epoch), then 2 workers:
    η + (kη - η) x 0.7 / 2 with k = 2, and the velocity scaled by new rate / old."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    warmup = hvk.LinearScalingWarmup(batch_size_per_worker=4, base_batch_size=4,
                                     warmup_epochs=2)
    warmup.set_model(model)
    warmup.load_state_dict({"base_lr": 0.05, "batches_per_epoch": 20, "passes": 1,
                            "batches_done": 14, "world_size": 3, "resized_at": None,
                            "samples_per_epoch": 240})
    old = 0.05 + (3 * 0.05 - 0.05) * (14 / 20) / 2  # the step rule at step 14, k = 3
    assert warmup.lr == pytest.approx(old, rel=1e-12)
    model.optimizer.learning_rate = old
    model.optimizer.momentums[0].assign(np.ones((2, 1)))
    warmup.set_world_size(2)
    assert warmup.samples_seen == 168 and warmup.resized_at == (14, 168)
    new = 0.05 + (2 * 0.05 - 0.05) * (168 / 240) / 2
    warmup.on_train_batch_begin(0)
    assert float(model.optimizer.learning_rate) == pytest.approx(new, rel=1e-6)
    assert np.allclose(ops.convert_to_numpy(model.optimizer.momentums[0]), new / old, rtol=1e-6)
    # One step later the 2 workers' samples count: 168 + 8.
    assert warmup.samples_seen == 176
    assert warmup.lr == pytest.approx(0.05 + 0.05 * (176 / 240) / 2, rel=1e-12)
