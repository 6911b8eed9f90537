"""Reading what tests/workers/torch_adapter.py saved, for the tests/adapters/test_torch_*.py."""

import torch


def tensors(run, name: str, rank: int = 0) -> dict[str, torch.Tensor]:
    """The parameters scenario ``name`` saved on ``rank``."""
    return torch.load(run.out_dir / f"{name}-rank{rank}.pt")


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of named tensors."""
    return max((a[name].double() - b[name].double()).abs().max().item() for name in b)
