"""Runs on each rank: Horovod's collectives on bfloat16 tensors (hvdtrain's patch
0011-bfloat16), each against what this rank computes on its own from every rank's
tensor, which it can build too.

The expected sums are exact (float64 over the bfloat16 values); the error allowed is
the patch's documented bound (docs/setup.md, patch 0011): each of the N - 1 additions of
a reduction rounds its float32 sum once to bfloat16, so
``|result - exact| <= (N - 1) * 2**-8 * sum(|x_i|)``, and an average (or a prescale)
rounds once more. On 2 ranks there is a single addition, so the result must equal,
bit for bit, this rank's own float32 sum rounded to bfloat16.

``python bfloat16.py``. Prints ``REPORT {json}`` per rank: per case, the error relative
to its bound (at most 1 passes) and, where the result must be exact, whether it is.
"""

import json

import torch
from reducescatter import my_rows

import hvdtrain.adapters.torch as hvt

UNIT_ROUNDOFF = 2.0 ** -8  # bfloat16 keeps 8 significant bits
# (rows, columns): odd sizes, one element, one above 1 MiB (patch 0008's ring under MPI)
# and above Horovod's 64 MiB fusion threshold's cycle share.
SHAPES = {"odd": (7, 13), "one": (1, 1), "large": (300_007, 3)}


def tensor_of(rank: int, rows: int, columns: int, salt: int = 0) -> torch.Tensor:
    """This rank's bfloat16 tensor: values of both signs over several binades, so sums
    round."""
    generator = torch.Generator().manual_seed(7919 * rank + rows + salt)
    values = torch.randn(rows, columns, generator=generator, dtype=torch.float64)
    scale = 2.0 ** torch.randint(-6, 7, (rows, columns), generator=generator)
    return (values * scale).to(torch.bfloat16)


def bound_ratio(result: torch.Tensor, tensors: list[torch.Tensor], scale: float,
                roundings: int) -> float:
    """The largest |result - exact| over its bound, with ``exact`` the scaled float64 sum
    of ``tensors`` and ``roundings`` roundings of at most one unit each."""
    exact = sum(t.to(torch.float64) for t in tensors) * scale
    magnitude = sum(t.to(torch.float64).abs() for t in tensors) * abs(scale)
    allowed = roundings * UNIT_ROUNDOFF * magnitude + torch.finfo(torch.bfloat16).tiny
    if result.shape != exact.shape or result.dtype != torch.bfloat16:
        return float("inf")
    if not exact.numel():  # a reduce-scatter's share of fewer rows than ranks
        return 0.0
    return float(((result.to(torch.float64) - exact).abs() / allowed).max())


def own_float32_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of two ranks' tensors as one float32 addition rounded to bfloat16."""
    first, second = (t.to(torch.float32) for t in tensors)
    return (first + second).to(torch.bfloat16)


def main() -> None:
    hvt.init()
    rank, size = hvt.rank(), hvt.size()
    additions = size - 1
    cases: dict[str, dict] = {}
    for label, (rows, columns) in SHAPES.items():
        every = [tensor_of(r, rows, columns) for r in range(size)]
        mine = every[rank]
        total = hvt.allreduce(mine, name=f"bf16.sum.{label}", op=hvt.Sum)
        cases[f"allreduce_sum_{label}"] = {"ratio": bound_ratio(total, every, 1.0, additions)}
        if size == 2:
            cases[f"allreduce_sum_{label}"]["exact"] = bool(torch.equal(total,
                                                                        own_float32_sum(every)))
        mean = hvt.allreduce(mine, name=f"bf16.mean.{label}", op=hvt.Average)
        cases[f"allreduce_average_{label}"] = {
            "ratio": bound_ratio(mean, every, 1.0 / size, additions + 1)}
        scaled = hvt.allreduce(mine, name=f"bf16.scaled.{label}", op=hvt.Sum,
                               prescale_factor=0.5, postscale_factor=3.0)
        cases[f"allreduce_scaled_{label}"] = {"ratio": bound_ratio(scaled, every, 1.5,
                                                                   additions + 2)}
        stacked = torch.stack([t.to(torch.float64) for t in every])
        for op, name, expected in ((hvt.Min, "min", stacked.min(0).values),
                                   (hvt.Max, "max", stacked.max(0).values)):
            extreme = hvt.allreduce(mine, name=f"bf16.{name}.{label}", op=op)
            cases[f"allreduce_{name}_{label}"] = {
                "exact": bool(torch.equal(extreme.to(torch.float64), expected))}
        scattered = hvt.reducescatter(mine, name=f"bf16.rs.{label}", op=hvt.Sum)
        rows_here = my_rows(rows, rank, size)
        cases[f"reducescatter_sum_{label}"] = {
            "ratio": bound_ratio(scattered, [t[rows_here] for t in every], 1.0, additions)}
        scattered_mean = hvt.reducescatter(mine, name=f"bf16.rs.mean.{label}",
                                           op=hvt.Average)
        cases[f"reducescatter_average_{label}"] = {
            "ratio": bound_ratio(scattered_mean, [t[rows_here] for t in every], 1.0 / size,
                                 additions + 1)}
        gathered = hvt.allgather(mine, name=f"bf16.gather.{label}")
        cases[f"allgather_{label}"] = {"exact": bool(torch.equal(gathered, torch.cat(every)))}
        sent = mine.clone()
        hvt.broadcast_(sent, root_rank=size - 1, name=f"bf16.bcast.{label}")
        cases[f"broadcast_{label}"] = {"exact": bool(torch.equal(sent, every[size - 1]))}
    # Fused: several tensors in Horovod's fusion buffer, through one grouped allreduce.
    shapes = [(5, 3), (11, 1), (2, 9)]
    every = [[tensor_of(r, rows, columns, salt=i) for i, (rows, columns) in enumerate(shapes)]
             for r in range(size)]
    fused = hvt.grouped_allreduce(every[rank], name="bf16.fused", op=hvt.Average)
    cases["grouped_allreduce_average"] = {"ratio": max(
        bound_ratio(result, [tensors[i] for tensors in every], 1.0 / size, additions + 1)
        for i, result in enumerate(fused))}
    handles = [hvt.allreduce_async(t, name=f"bf16.async.{i}", op=hvt.Sum)
               for i, t in enumerate(every[rank])]
    results = [hvt.synchronize(handle) for handle in handles]
    cases["allreduce_async_fused_sum"] = {"ratio": max(
        bound_ratio(result, [tensors[i] for tensors in every], 1.0, additions)
        for i, result in enumerate(results))}
    print("REPORT " + json.dumps({"rank": rank, "size": size, "cases": cases}), flush=True)
    hvt.shutdown()


if __name__ == "__main__":
    main()
