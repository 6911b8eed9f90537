"""The textbook data-parallel step, through hvdtrain's PyTorch DistributedOptimizer.

Run:  horovodrun -np 2 python examples/seed_allreduce_torch.py

Weights w = [1.0, -1.0], learning rate 0.1; worker 0's gradient is [0.6, -0.2] and
worker 1's is [0.2, 0.4]. A worker stepping alone would move to w - 0.1 * g; with
the gradients averaged, every worker applies the same step with g = [0.4, 0.1].
Every rank prints:

    worker0_local_step [0.94, -0.98]
    allreduced_step [0.96, -1.01]
    gradient_mean [0.4, 0.1]
"""

import sys

import torch

import hvdtrain.adapters.torch as hvt

INITIAL_WEIGHTS = [1.0, -1.0]
GRADIENTS = {0: [0.6, -0.2], 1: [0.2, 0.4]}
LEARNING_RATE = 0.1


def shown(tensor: torch.Tensor) -> list[float]:
    return [round(value, 6) for value in tensor.tolist()]


def one_step(distributed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step on loss = w . g_rank (whose gradient is g_rank); returns (w, grad)."""
    weights = torch.nn.Parameter(torch.tensor(INITIAL_WEIGHTS, dtype=torch.float64))
    optimizer = torch.optim.SGD([weights], lr=LEARNING_RATE)
    if distributed:
        optimizer = hvt.DistributedOptimizer(optimizer, [("w", weights)])
    loss = (weights * torch.tensor(GRADIENTS[hvt.rank()], dtype=torch.float64)).sum()
    loss.backward()
    optimizer.step()  # distributed: averages the gradients, then applies them
    return weights.detach(), weights.grad.detach()


def main() -> int:
    hvt.init()
    if hvt.size() != 2:
        print(f"this example needs exactly 2 workers (horovodrun -np 2), got {hvt.size()}",
              file=sys.stderr)
        return 2
    local_weights, _ = one_step(distributed=False)
    worker0_local = hvt.broadcast(local_weights, root_rank=0, name="worker0_local_step")
    allreduced_weights, gradient_mean = one_step(distributed=True)
    print(f"worker0_local_step {shown(worker0_local)}")
    print(f"allreduced_step {shown(allreduced_weights)}")
    print(f"gradient_mean {shown(gradient_mean)}")
    hvt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
