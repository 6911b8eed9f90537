"""The alpha-beta model of ring collectives, fitted to measured times, and the step time and
scaling efficiency it projects for data-parallel training (benchmark 10, network.py).

A ring of N workers moves a buffer of n bytes in steps. Reduce-scatter and allgather
take N - 1 steps, each sending n/N bytes per worker; allreduce is one then the other.
Each step costs alpha (per message: the link's latency and the collective's fixed cost)
plus its bytes times beta (seconds per byte, 1 / bandwidth):

    allreduce(N, n)      = 2(N - 1) alpha + 2(N - 1)/N · n · beta
    reduce_scatter(N, n) = allgather(N, n) = (N - 1) alpha + (N - 1)/N · n · beta

A training step on N workers, each with a fixed batch (weak scaling), computes for
``compute_s`` and averages ``gradient_bytes``; overlapping starts the allreduce during
backward, which can hide it behind the backward pass (about 2/3 of forward plus
backward). Scaling efficiency is throughput(N) / (N x throughput(1)) = compute / step.

>>> links = RingLinks(alpha_s=1e-4, beta_s_per_byte=8e-9)   # 1 Gbit/s, 0.1 ms a message
>>> round(links.allreduce_s(2, 125_000_000), 4)
1.0002
>>> step = StepModel(compute_s=0.25, gradient_bytes=102_400_000)
>>> round(step.efficiency(links, 256), 2), round(step.efficiency(links, 256, overlap=True), 2)
(0.13, 0.14)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

OPERATIONS = ("allreduce", "reducescatter", "allgather")
BACKWARD_SHARE = 2 / 3  # of forward plus backward: what an overlapped allreduce can hide behind


def ring_terms(operation: str, workers: int, nbytes: float) -> tuple[float, float]:
    """How many alpha and how many bytes of beta ``operation`` of ``nbytes`` costs on a ring
    of ``workers``."""
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
    passes = 2 if operation == "allreduce" else 1
    return passes * (workers - 1), passes * (workers - 1) / workers * nbytes


@dataclass(frozen=True)
class RingLinks:
    """A ring's cost per message (``alpha_s``) and per byte (``beta_s_per_byte``)."""

    alpha_s: float
    beta_s_per_byte: float

    @property
    def bandwidth_gbit_s(self) -> float:
        """The link rate the fitted beta stands for."""
        return 8 / self.beta_s_per_byte / 1e9

    def time_s(self, operation: str, workers: int, nbytes: float) -> float:
        """The model's time of ``operation`` of ``nbytes`` on ``workers``."""
        messages, moved = ring_terms(operation, workers, nbytes)
        return messages * self.alpha_s + moved * self.beta_s_per_byte

    def allreduce_s(self, workers: int, nbytes: float) -> float:
        return self.time_s("allreduce", workers, nbytes)

    def with_rate(self, gbit_s: float) -> RingLinks:
        """The same alpha on a link of ``gbit_s`` Gbit/s."""
        return RingLinks(self.alpha_s, 8 / (gbit_s * 1e9))


def fit_ring(points: Iterable[tuple[str, int, float, float]]) -> RingLinks:
    """alpha and beta fitted to measured ``(operation, workers, bytes, seconds)`` points by least
    squares on the relative error (so that small messages, which carry alpha, weigh as much
    as large ones, which carry beta); neither may be negative."""
    rows = [(*ring_terms(operation, workers, nbytes), seconds)
            for operation, workers, nbytes, seconds in points]
    if len(rows) < 2:
        raise ValueError("fitting alpha and beta needs at least 2 measured points")
    terms = np.array([[alpha, beta] for alpha, beta, _ in rows], dtype=np.float64)
    times = np.array([seconds for *_, seconds in rows], dtype=np.float64)
    weighted = terms / times[:, None]
    alpha, beta = np.linalg.lstsq(weighted, np.ones(len(rows)), rcond=None)[0]
    if alpha < 0:  # all bandwidth: refit beta alone
        alpha, beta = 0.0, float(np.linalg.lstsq(weighted[:, 1:], np.ones(len(rows)),
                                                 rcond=None)[0][0])
    elif beta < 0:
        alpha, beta = float(np.linalg.lstsq(weighted[:, :1], np.ones(len(rows)),
                                            rcond=None)[0][0]), 0.0
    return RingLinks(float(alpha), float(beta))


@dataclass(frozen=True)
class StepModel:
    """One worker's training step: ``compute_s`` of forward, backward and update on its
    batch, and ``gradient_bytes`` to average (float32; half of them on the wire when
    compressed to 16 bits), in ``messages`` allreduces (1 for one fused buffer)."""

    compute_s: float
    gradient_bytes: float
    messages: int = 1

    def communication_s(self, links: RingLinks, workers: int, compressed: bool = False) -> float:
        """The allreduces' time on ``workers`` (0 on one)."""
        if workers == 1:
            return 0.0
        nbytes = self.gradient_bytes / (2 if compressed else 1)
        return self.messages * links.allreduce_s(workers, nbytes / self.messages)

    def step_s(self, links: RingLinks, workers: int, overlap: bool = False,
               compressed: bool = False) -> float:
        """Compute plus what of the communication is not hidden behind backward."""
        hidden = BACKWARD_SHARE * self.compute_s if overlap else 0.0
        return self.compute_s + max(0.0, self.communication_s(links, workers, compressed)
                                    - hidden)

    def efficiency(self, links: RingLinks, workers: int, overlap: bool = False,
                   compressed: bool = False) -> float:
        """throughput(N) / (N x throughput(1))."""
        return self.compute_s / self.step_s(links, workers, overlap, compressed)
