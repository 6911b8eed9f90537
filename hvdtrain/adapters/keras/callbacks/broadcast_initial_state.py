"""``BroadcastInitialState``: every replica starts from rank 0's weights and optimizer state."""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras import backend, collectives, tally
from hvdtrain.adapters.keras.optimizer import require_agreeing_loss_scaling
from hvdtrain.collective import require_initialized
from hvdtrain.consistency import check_ranks_agree, software_versions


class BroadcastInitialState(keras.callbacks.Callback):
    """Start every replica from rank 0's weights and optimizer state.

    At ``on_train_begin`` it builds the optimizer's variables (if fit has not yet),
    checks that every rank has the same variables, optimizer and software, and
    broadcasts the model's weights and the optimizer's variables from ``root_rank``,
    so the replicas are identical before the first step (Horovod's callback waits
    for the end of the first batch). Put it first in ``callbacks``.

    Example::

        model.fit(x, y, callbacks=[hvk.BroadcastInitialState()])
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None) -> None:
        """Check agreement, then broadcast (Keras calls it when ``fit`` starts)."""
        require_initialized(backend.collective(), "BroadcastInitialState")
        if getattr(self.model, "jit_compile", False):
            raise ValueError("compile the model with jit_compile=False: Horovod's collectives "
                             "have no XLA kernels in this build")
        optimizer = self.model.optimizer
        require_agreeing_loss_scaling(optimizer)
        variables = list(self.model.variables)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            variables += optimizer.variables
        check_ranks_agree(backend.collective(), {
            "variables (shape, dtype)": [(tuple(v.shape), str(v.dtype)) for v in variables],
            "optimizer class": type(optimizer).__name__ if optimizer is not None else None,
            "optimizer config": _comparable_config(optimizer),
            **software_versions("keras", "tensorflow", "torch", "horovod"),
            # Ranks with and without the ops would send differently shaped allreduces.
            "flat gradient buffer (hvdtrain._tf_packing, built by scripts/setup.sh)":
                tally.native_ops() is not None,
        }, "BroadcastInitialState")
        collectives.broadcast_variables(self._to_broadcast(variables), self.root_rank)

    def _to_broadcast(self, variables: list) -> list:
        return variables


class BroadcastGlobalVariablesCallback(BroadcastInitialState):
    """Horovod's name: :class:`BroadcastInitialState` with Horovod's arguments.

    Horovod's callback broadcasts after the first batch (that batch's update starts
    from unequal weights); this one, like BroadcastInitialState, before the first step.

    Args:
        root_rank: the rank whose values everyone takes.
        device: accepted for Horovod's signature; unused (no GPU placement here).
        local_variables: variables each rank keeps its own value of.
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: list | None = None) -> None:
        super().__init__(root_rank)
        self._local = {id(v) for v in local_variables or ()}

    def _to_broadcast(self, variables: list) -> list:
        return [v for v in variables if id(v) not in self._local]


def _comparable_config(optimizer: keras.optimizers.Optimizer | None) -> dict | None:
    """The optimizer's configuration without what legitimately differs between ranks."""
    if optimizer is None:
        return None
    config = dict(optimizer.get_config())
    config.pop("name", None)  # auto-numbered ("SGD_3") by how many were made on each rank
    config.pop("learning_rate", None)  # set by schedules and callbacks; broadcast anyway
    return config
