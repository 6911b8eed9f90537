"""Runs on each rank: Horovod's reduce-scatter (patch 0007's ring under Gloo, 0008's under
MPI for buffers of 1 MiB and more) on tensors every rank can also build for the others,
so the expected slice is computed here independently: the sum (or mean) over the ranks'
tensors, split by rows as Horovod documents it (the first ``rows % size`` ranks get one
row more).

``python reducescatter.py``. Prints ``REPORT {json}`` per rank with, per case, the
largest difference from the expected slice and its shape.
"""

import json

import torch

import hvdtrain.adapters.torch as hvt

# (rows, columns, dtype): uneven splits, fewer rows than ranks, integers, one column; the
# large ones (over 1 MiB) take patch 0008's ring under MPI, float16 its own sum operation.
CASES = {"float32_uneven": (7, 5, torch.float32), "float64_even": (6, 3, torch.float64),
         "int32": (9, 2, torch.int32), "fewer_rows_than_ranks": (2, 4, torch.float64),
         "vector": (1001, 1, torch.float64), "float32_large_uneven": (65_537, 5, torch.float32),
         "float16_large": (300_001, 2, torch.float16)}


def tensor_of(rank: int, rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + rows)
    values = torch.randint(-50, 50, (rows, columns), generator=generator)
    # Integers where the type is too coarse for sevenths to sum exactly.
    return values.to(dtype) if dtype in (torch.int32, torch.float16) else values.to(dtype) / 7


def my_rows(rows: int, rank: int, size: int) -> slice:
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def expected(rows: int, columns: int, dtype: torch.dtype, average: bool) -> torch.Tensor:
    total = sum(tensor_of(r, rows, columns, dtype).to(torch.float64) for r in range(hvt.size()))
    if average:
        total = total / hvt.size()
    return total[my_rows(rows, hvt.rank(), hvt.size())]


def difference(result: torch.Tensor, wanted: torch.Tensor) -> float:
    if result.shape != wanted.shape:
        return float("inf")
    return float((result.to(torch.float64) - wanted).abs().max()) if wanted.numel() else 0.0


def main() -> None:
    hvt.init()
    outcome = {}
    for name, (rows, columns, dtype) in CASES.items():
        mine = tensor_of(hvt.rank(), rows, columns, dtype)
        summed = hvt.reducescatter(mine, name=f"rs.{name}", op=hvt.Sum)
        outcome[name] = {"sum": difference(summed, expected(rows, columns, dtype, False)),
                         "shape": list(summed.shape)}
        if dtype != torch.int32:
            mean = hvt.reducescatter(mine, name=f"rs.{name}.mean", op=hvt.Average)
            outcome[name]["mean"] = difference(mean, expected(rows, columns, dtype, True))
    # Scaled first (the copy-in path) and fused (two tensors in one buffer).
    rows, columns, dtype = CASES["float64_even"]
    mine = tensor_of(hvt.rank(), rows, columns, dtype)
    for case, scaled_rows in (("prescaled", rows), ("prescaled_large", 150_001)):
        tensor = tensor_of(hvt.rank(), scaled_rows, columns, dtype)
        scaled = hvt.reducescatter(tensor, name=f"rs.{case}", op=hvt.Sum, prescale_factor=3.0)
        outcome[case] = {"sum": difference(scaled,
                                           3 * expected(scaled_rows, columns, dtype, False))}
    other = tensor_of(hvt.rank(), 7, 5, torch.float64)
    fused = hvt.grouped_reducescatter([mine, other], name="rs.fused", op=hvt.Sum)
    outcome["fused"] = {"sum": max(difference(fused[0], expected(rows, columns, dtype, False)),
                                   difference(fused[1], expected(7, 5, torch.float64, False)))}
    large = tensor_of(hvt.rank(), 100_003, 2, torch.float64)
    fused = hvt.grouped_reducescatter([mine, large], name="rs.fused_large", op=hvt.Sum)
    outcome["fused_large"] = {
        "sum": max(difference(fused[0], expected(rows, columns, dtype, False)),
                   difference(fused[1], expected(100_003, 2, torch.float64, False)))}
    print("REPORT " + json.dumps({"rank": hvt.rank(), "size": hvt.size(),
                                  "cases": outcome}), flush=True)
    hvt.shutdown()


if __name__ == "__main__":
    main()
