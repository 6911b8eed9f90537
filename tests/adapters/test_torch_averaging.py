"""GradientAveraging (hvdtrain/adapters/torch/averaging.py) and the classes it builds
on and under: the class DistributedOptimizer returns, by plain inheritance, on one
process (``hvt.init()`` without a launcher). Its averaging on 2 real ranks is
test_torch_optimizer.py's (flat and per tensor against one process), its ZeRO
subclasses' test_torch_sharding.py's and test_torch_sharded_gradients.py's.
"""

import json
import textwrap

import pytest
from torch_results import one_process_cases

_CLASSES = textwrap.dedent("""
    import inspect, json, torch
    import hvdtrain.adapters.torch as hvt

    hvt.init()
    for settings in ({}, {"shard_state": True}, {"shard_gradients": True}):
        model = torch.nn.Linear(3, 2)
        base = torch.optim.AdamW(model.parameters(), lr=0.1)
        optimizer = hvt.DistributedOptimizer(base, model.named_parameters(), **settings)
        made = type(optimizer)
        # torch wraps every optimizer class's step with its profiling hooks on first use
        own = sorted(name for name, value in vars(made).items()
                     if inspect.isfunction(value) and not getattr(value, "hooked", False))
        report = {"case": json.dumps(settings)}
        report.update({
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in made.__mro__],
            "user_mro": [f"{c.__module__}.{c.__qualname__}" for c in type(base).__mro__],
            "own_methods": own,
            "is_adamw": isinstance(optimizer, torch.optim.AdamW),
            "name": made.__name__,
            "shard_state": optimizer.shard_state,
            "shard_gradients": optimizer.shard_gradients,
            "step_defined_by": next(c.__qualname__ for c in made.__mro__
                                    if "step" in vars(c) and
                                    not getattr(vars(c)["step"], "hooked", False)),
        })
        print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def classes() -> dict:
    return {case: records[0] for case, records in one_process_cases(_CLASSES).items()}


@pytest.mark.parametrize(("settings", "hvdtrain_classes"), [
    ({}, ["averaging.GradientAveraging", "hooks.BackwardHooks"]),
    ({"shard_state": True}, ["sharding.ShardedState", "averaging.GradientAveraging",
                             "hooks.BackwardHooks"]),
    ({"shard_gradients": True}, ["sharded_gradients.ShardedGradients",
                                 "sharding.ShardedState", "averaging.GradientAveraging",
                                 "hooks.BackwardHooks"]),
])
def test_the_made_class_is_hvdtrains_classes_over_the_users_by_inheritance(
        classes, settings, hvdtrain_classes):
    made = classes[json_key(settings)]
    assert made["mro"][0] == "torch.optim.adamw.AdamW"  # the made class, named as the user's
    assert made["mro"][1:1 + len(hvdtrain_classes)] == [
        f"hvdtrain.adapters.torch.{name}" for name in hvdtrain_classes]
    assert made["mro"][1 + len(hvdtrain_classes):] == made["user_mro"]  # AdamW's own, after
    assert made["own_methods"] == [], "a method spliced into the made class"
    assert made["is_adamw"] and made["name"] == "AdamW"
    assert made["step_defined_by"] == "GradientAveraging"


def test_the_sharding_flags_come_from_the_class(classes):
    assert [(made["shard_state"], made["shard_gradients"]) for made in classes.values()] == [
        (False, False), (True, False), (True, True)]


def json_key(settings: dict) -> str:
    return json.dumps(settings)
