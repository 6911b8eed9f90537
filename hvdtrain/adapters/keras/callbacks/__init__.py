"""The Keras adapter's callbacks for ``model.fit``, one per file."""

from hvdtrain.adapters.keras.callbacks.broadcast_initial_state import BroadcastInitialState
from hvdtrain.adapters.keras.callbacks.collective_watchdog import CollectiveWatchdog
from hvdtrain.adapters.keras.callbacks.linear_scaling_warmup import LinearScalingWarmup
from hvdtrain.adapters.keras.callbacks.metric_average import MetricAverage
from hvdtrain.adapters.keras.callbacks.model_checkpoint import ModelCheckpoint
from hvdtrain.adapters.keras.callbacks.replica_check import ReplicaCheck

__all__ = ["BroadcastInitialState", "CollectiveWatchdog", "LinearScalingWarmup",
           "MetricAverage", "ModelCheckpoint", "ReplicaCheck"]
