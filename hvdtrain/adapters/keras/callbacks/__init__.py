"""The Keras adapter's callbacks for ``model.fit``, one per file (Horovod's names
beside the ones they resemble)."""

from hvdtrain.adapters.keras.callbacks.broadcast_initial_state import (
    BroadcastGlobalVariablesCallback,
    BroadcastInitialState,
)
from hvdtrain.adapters.keras.callbacks.collective_watchdog import CollectiveWatchdog
from hvdtrain.adapters.keras.callbacks.join_at_epoch_end import JoinAtEpochEnd
from hvdtrain.adapters.keras.callbacks.learning_rate_schedule import (
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
)
from hvdtrain.adapters.keras.callbacks.linear_scaling_warmup import LinearScalingWarmup
from hvdtrain.adapters.keras.callbacks.metric_average import MetricAverage, MetricAverageCallback
from hvdtrain.adapters.keras.callbacks.model_checkpoint import ModelCheckpoint
from hvdtrain.adapters.keras.callbacks.replica_check import ReplicaCheck
from hvdtrain.adapters.keras.callbacks.step_time_logs import StepTimeLogs

__all__ = ["BroadcastGlobalVariablesCallback", "BroadcastInitialState", "CollectiveWatchdog",
           "JoinAtEpochEnd", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "LinearScalingWarmup", "MetricAverage", "MetricAverageCallback", "ModelCheckpoint",
           "ReplicaCheck", "StepTimeLogs"]
