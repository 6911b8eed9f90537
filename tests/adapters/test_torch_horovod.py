"""What the torch adapter takes from Horovod (hvdtrain/adapters/torch/_horovod.py): the
private APIs it lists exist in the installed Horovod, the version they were checked
against is the one the set-up pins, and a missing one is named. Its Collective and
TensorCollective move data on 2 real ranks in test_torch_optimizer.py
(``tensor_collective``) and test_torch_horovod_api.py (process sets)."""

from pathlib import Path

import pytest

from hvdtrain.adapters.torch import _horovod


def test_every_private_api_listed_is_in_the_installed_horovod():
    _horovod.require_private_apis()
    for owner, (value, names) in _horovod.PRIVATE_APIS.items():
        for name in names:
            assert hasattr(value, name), f"{owner}.{name}"


def test_the_checked_version_is_the_pinned_one():
    pins = (Path(__file__).resolve().parents[2] / "constraints.txt").read_text().splitlines()
    assert f"horovod=={_horovod.CHECKED_VERSION}" in pins


def test_the_optimizer_relies_on_no_private_horovod_api():
    assert not any("optimizer" in owner for owner in _horovod.PRIVATE_APIS)


def test_a_missing_private_api_is_named_with_the_fix(monkeypatch):
    monkeypatch.setitem(_horovod.PRIVATE_APIS, "horovod.common.elastic",
                        (object(), ("run_fn",)))
    with pytest.raises(ImportError, match=r"horovod.common.elastic.run_fn.*"
                                          r"scripts/build-horovod.sh --install"):
        _horovod.require_private_apis()
