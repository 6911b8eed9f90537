"""Each shared adapter launch (tests/adapters/conftest.py) as a whole: every scenario ran
without error and every rank exited with 0. The scenarios' own tests judge their
results; this catches what none of them asks about (a failure after the last report,
a rank that crashed on shutdown)."""


def test_the_torch_launch_ran_every_scenario_and_ended_cleanly(torch_run):
    torch_run.require_clean()


def test_the_keras_launch_ran_every_scenario_and_ended_cleanly(keras_run):
    keras_run.require_clean()


def test_the_keras_torch_backend_launch_ran_every_scenario_and_ended_cleanly(keras_torch_run):
    keras_torch_run.require_clean()
