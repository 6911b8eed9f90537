"""Each warmup setting in turn differs on rank 1, and every adapter's
``LinearScalingWarmup`` must stop both ranks with the same RankDisagreementError naming
it: ``python warmup_agreement.py torch|keras|numpy`` under horovodrun (keras also runs
the TensorFlow schedule, hvdtrain.adapters.tensorflow).

Prints ``REPORT {"scenario": "<adapter> <setting>", "rank": r, "error": message}`` per
adapter and setting (``error`` null when nothing was raised).
"""

import sys

import numpy as np

BASE_LR = 0.1
SETTINGS = {"batch_size_per_worker": 32, "steps_per_epoch": 10, "base_batch_size": 64,
            "warmup_epochs": 2, "milestones": (3,), "gamma": 0.5}
# What rank 1 has instead, one setting at a time.
DIFFERENT = {"batch_size_per_worker": 16, "steps_per_epoch": 12, "base_batch_size": 128,
             "warmup_epochs": 1, "milestones": (4,), "gamma": 0.2,
             "backward_passes_per_step": 2, "base_lr": 0.2}
# Where an adapter takes the accumulation steps from its optimizer, the optimizer's own
# agreement covers them.
FROM_THE_OPTIMIZER = {"backward_passes_per_step"}


def scenarios_for(adapter: str, rank, make_warmup, disagreement_error, varied=DIFFERENT):
    """One scenario per setting: ``make_warmup(base_lr, settings)`` on every rank, rank 1's
    with that setting changed."""
    from scenarios import report

    def scenario(setting):
        def run() -> None:
            settings, base_lr = dict(SETTINGS), BASE_LR
            if rank() == 1:
                if setting == "base_lr":
                    base_lr = DIFFERENT["base_lr"]
                else:
                    settings[setting] = DIFFERENT[setting]
            try:
                make_warmup(base_lr, settings)
                error = None
            except disagreement_error as raised:
                error = str(raised)
            report(rank(), f"{adapter} {setting}", error=error)
        return run

    return {f"{adapter} {setting}": scenario(setting) for setting in varied}


def torch_scenarios():
    import torch

    import hvdtrain.adapters.torch as hvt

    hvt.init()

    def make(base_lr, settings):
        model = torch.nn.Linear(2, 1)
        hvt.LinearScalingWarmup(torch.optim.SGD(model.parameters(), lr=base_lr), **settings)

    varied = [name for name in DIFFERENT if name not in FROM_THE_OPTIMIZER]
    return hvt.rank, scenarios_for("torch", hvt.rank, make, hvt.RankDisagreementError, varied)


def keras_scenarios():
    import keras

    import hvdtrain.adapters.keras as hvk
    import hvdtrain.adapters.tensorflow as hvtf

    hvk.init()
    x = np.zeros((8, 2), np.float32)
    y = np.zeros((8, 1), np.float32)

    def callback(base_lr, settings):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                  callbacks=[hvk.LinearScalingWarmup(base_lr=base_lr, **settings)])

    def schedule(base_lr, settings):
        hvtf.LinearScalingWarmup(base_lr, **settings)

    varied = [name for name in DIFFERENT if name not in FROM_THE_OPTIMIZER]
    return hvk.rank, {
        **scenarios_for("keras", hvk.rank, callback, hvk.RankDisagreementError, varied),
        **scenarios_for("tensorflow", hvk.rank, schedule, hvk.RankDisagreementError),
    }


def numpy_scenarios():
    import hvdtrain.adapters.numpy as hvn

    hvn.init()

    def make(base_lr, settings):
        optimizer = hvn.DistributedSGD([np.zeros(3)], lr=BASE_LR)
        optimizer.lr = base_lr  # after DistributedSGD's own agreement, which covers lr
        hvn.LinearScalingWarmup(optimizer, **settings)

    return hvn.rank, scenarios_for("numpy", hvn.rank, make, hvn.RankDisagreementError)


if __name__ == "__main__":
    from scenarios import run_scenarios

    rank, scenarios = {"torch": torch_scenarios, "keras": keras_scenarios,
                       "numpy": numpy_scenarios}[sys.argv[1]]()
    run_scenarios(rank, scenarios)
