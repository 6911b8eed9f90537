"""Runs on every rank: rounds of init, collectives and shutdown, as Horovod's own tests do.

``python reinit.py ROUNDS [--slow-rendezvous-deletes MS]``. Each round calls
``hvt.init()`` with a process set of every rank but rank 0, runs allreduces, an
alltoall, an allgather, a broadcast and an allreduce in the process set, checks each
result against what this rank computes itself, then ``barrier()`` and ``shutdown()``.
Prints one ``REPORT {json}`` line per rank after the last round: the rounds run and the
first wrong result (None when every result was right).

Under MPI the worker starts MPI through mpi4py before the first round, as hvdtrain's
docs tell (Horovod would finalize an MPI it started at the first shutdown()); with
``--mpi-started-by-horovod`` it leaves that to Horovod, runs one round and reports, as
``refused``, the error of the ``init()`` that follows.

``--slow-rendezvous-deletes MS`` (Gloo only) puts a proxy in front of horovodrun's
rendezvous server for rank 1 that holds each of its DELETE requests (a rank saying
it finished with a scope) for MS milliseconds, as a slow link or a busy host does. The
other rank then finishes its next scopes first, which is the order in which Horovod
0.28.1's server forgot that this rank had finished a scope, never cleared it, and gave
the next round the last round's addresses (patch 0010).
"""

import http.client
import http.server
import os
import sys
import threading
import time

import torch
from scenarios import report

import hvdtrain.adapters.torch as hvt
from hvdtrain.runtime import launcher_rank, launcher_size, uses_mpi

ELEMENTS = 11


class DelayingProxy(http.server.ThreadingHTTPServer):
    """Forwards HTTP requests to ``target``, holding each DELETE for ``delay_s``."""

    daemon_threads = True

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        super().__init__(("127.0.0.1", 0), _ForwardingHandler)


class _ForwardingHandler(http.server.BaseHTTPRequestHandler):
    server: DelayingProxy

    def _forward(self) -> None:
        if self.command == "DELETE":
            time.sleep(self.server.delay_s)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        upstream = http.client.HTTPConnection(*self.server.target, timeout=30)
        upstream.request(self.command, self.path, body=body,
                         headers={"Content-Length": str(length)} if body else {})
        answer = upstream.getresponse()
        payload = answer.read()
        upstream.close()
        self.send_response(answer.status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


def slow_down_rendezvous_deletes(delay_s: float) -> None:
    """Route this process's rendezvous requests through a :class:`DelayingProxy`."""
    target = (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
              int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
    proxy = DelayingProxy(target, delay_s)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = "127.0.0.1"
    os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(proxy.server_address[1])


def rank_tensor(rank: int, offset: int) -> torch.Tensor:
    return torch.arange(ELEMENTS, dtype=torch.float64) * (rank + 1) + offset


def one_round(round_index: int) -> str | None:
    """One init/collectives/shutdown round; what was wrong, or None."""
    others = hvt.ProcessSet(list(range(1, launcher_size())))
    hvt.init(process_sets=[others])
    rank, size = hvt.rank(), hvt.size()
    wrong = None

    def expect(what: str, got: torch.Tensor, wanted: torch.Tensor) -> None:
        nonlocal wrong
        if wrong is None and not torch.equal(got, wanted):
            wrong = f"round {round_index}: {what} gave {got.tolist()}, expected {wanted.tolist()}"

    for i in range(6):
        expect(f"allreduce {i}", hvt.allreduce(rank_tensor(rank, i), op=hvt.Sum, name=f"sum.{i}"),
               sum(rank_tensor(r, i) for r in range(size)))
    sent = torch.tensor([100.0 * rank + destination for destination in range(size)])
    expect("alltoall", hvt.alltoall(sent, name="alltoall"),
           torch.tensor([100.0 * source + rank for source in range(size)]))
    expect("allgather", hvt.allgather(rank_tensor(rank, 0).view(1, -1), name="allgather"),
           torch.stack([rank_tensor(r, 0) for r in range(size)]))
    expect("broadcast", hvt.broadcast(rank_tensor(rank, 5), root_rank=size - 1, name="bcast"),
           rank_tensor(size - 1, 5))
    if others.included():
        expect("process set allreduce",
               hvt.allreduce(rank_tensor(rank, 1), op=hvt.Sum, name="set", process_set=others),
               sum(rank_tensor(r, 1) for r in range(1, size)))
    hvt.barrier()
    hvt.shutdown()
    return wrong


def main() -> None:
    rounds = int(sys.argv[1])
    if "--slow-rendezvous-deletes" in sys.argv and launcher_rank() == 1:
        slow_down_rendezvous_deletes(
            float(sys.argv[sys.argv.index("--slow-rendezvous-deletes") + 1]) / 1000)
    if "--mpi-started-by-horovod" in sys.argv:
        wrong = one_round(0)
        try:
            hvt.init()
        except RuntimeError as error:
            report(launcher_rank(), "refused", first_wrong=wrong, refused=str(error))
        return
    if uses_mpi():
        from mpi4py import MPI  # noqa: F401  (starts MPI, so Horovod leaves it running)
    started, first_wrong = time.monotonic(), None
    for round_index in range(rounds):
        first_wrong = first_wrong or one_round(round_index)
    report(launcher_rank(), "rounds", rounds=rounds, first_wrong=first_wrong,
           seconds_per_round=(time.monotonic() - started) / rounds)


if __name__ == "__main__":
    main()
