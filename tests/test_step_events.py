"""hvdtrain.step_events: the observers of every averaged step, in one process (the
adapters tell them on real ranks: test_torch_optimizer.py, test_keras_optimizer.py,
test_numpy.py)."""

from hvdtrain import step_events
from hvdtrain.step_events import StepObservers


class Recorder:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def reduction_started(self, step):
        self.log.append((self.name, "started", step))

    def reduction_finished(self, step):
        self.log.append((self.name, "finished", step))

    def step_finished(self, step, applied):
        self.log.append((self.name, "step", step, applied))


def test_observers_hear_every_event_in_order_until_removed():
    observers, log = StepObservers(), []
    assert not observers
    stop_first = observers.add(Recorder(log, "first"))
    second = Recorder(log, "second")
    observers.add(second)
    assert observers
    observers.reduction_started(0)
    observers.reduction_finished(0)
    observers.step_finished(0, applied=False)
    stop_first()
    observers.step_finished(1, applied=True)
    observers.remove(second)
    observers.remove(second)  # nothing the second time
    observers.step_finished(2, applied=True)
    assert log == [("first", "started", 0), ("second", "started", 0),
                   ("first", "finished", 0), ("second", "finished", 0),
                   ("first", "step", 0, False), ("second", "step", 0, False),
                   ("second", "step", 1, True)]
    assert not observers
    assert isinstance(step_events.step_observers, StepObservers)


def test_a_process_sets_reductions_tell_nobody():
    assert step_events.observers_of(4, 4) is step_events.step_observers
    assert step_events.observers_of(2, 4) is not step_events.step_observers
    assert not step_events.observers_of(2, 4)
