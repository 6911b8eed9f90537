"""The PyTorch models and synthetic batches the benchmarks train (all seeded), and
what their workers count of an optimizer.

- ``mlp``: 784-512-512-10 on 64 examples per worker (the overhead and DDP model).
- ``conv``: a small conv net on 32x32x3 images, 32 per worker: little to allreduce
  (56 k parameters) for much compute (compute-heavy).
- ``wide``: 12 fully connected 1024x1024 layers on 16 examples per worker: 12.6 M
  parameters in 26 tensors for little compute (communication-heavy).
- ``convdense``: two 3x3 conv layers of 32 channels on 32x32x3 images, then six
  512x512 dense layers, 32 per worker: much compute and 6.3 MB of gradients in 18
  tensors (compute-heavy, with a real allreduce).
- ``large``: 1024-4096-4096-4096-4096-1024, 58.7 M parameters on 8 examples per worker:
  the sharded optimizer state's memory benchmark (AdamW's state alone is 470 MB).
"""

from __future__ import annotations

import itertools

import torch

BATCH_PER_WORKER = {"mlp": 64, "conv": 32, "wide": 16, "convdense": 32, "large": 8}
IMAGE_MODELS = ("conv", "convdense")
# Input features and classes where they are not MNIST's 784 and 10.
INPUTS, CLASSES = {"large": 1024}, {"large": 1024}


def timed_steps(spec: str, name: str) -> int:
    """How many steps a worker times for model ``name``: ``spec`` is one number for
    every model ("10") or one per model ("mlp=200,large=10")."""
    if "=" not in spec:
        return int(spec)
    counts = dict(part.split("=") for part in spec.split(","))
    return int(counts[name])


def make_model(name: str) -> torch.nn.Module:
    """A fresh ``name`` model with the same initial weights on every rank."""
    torch.manual_seed(0)
    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
            torch.nn.ReLU(), torch.nn.Linear(512, 10))
    if name == "conv":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    if name == "convdense":
        layers = [torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                  torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                  torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten()]
        for _ in range(6):
            layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))
    if name == "wide":
        layers: list[torch.nn.Module] = [torch.nn.Linear(784, 1024), torch.nn.ReLU()]
        for _ in range(11):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))
    if name == "large":
        widths = (1024, 4096, 4096, 4096, 4096, 1024)
        layers = []
        for width_in, width_out in itertools.pairwise(widths):
            layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])
    raise ValueError(f"unknown model {name!r}; choose from {sorted(BATCH_PER_WORKER)}")


def make_batch(name: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's synthetic batch for ``name`` (different on every rank)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    batch = BATCH_PER_WORKER[name]
    shape = (batch, 3, 32, 32) if name in IMAGE_MODELS else (batch, INPUTS.get(name, 784))
    return (torch.randn(*shape, generator=generator),
            torch.randint(0, CLASSES.get(name, 10), (batch,), generator=generator))


def parameter_count(model: torch.nn.Module) -> tuple[int, int]:
    """(number of parameters, number of parameter tensors)."""
    parameters = list(model.parameters())
    return sum(p.numel() for p in parameters), len(parameters)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in the optimizer state this process holds (a torch
    ``ZeroRedundancyOptimizer`` keeps its shard in the optimizer it wraps)."""
    inner = getattr(optimizer, "optim", optimizer)
    return sum(value.numel() * value.element_size() for state in inner.state.values()
               for value in state.values() if torch.is_tensor(value))
