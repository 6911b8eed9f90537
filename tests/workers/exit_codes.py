"""Rank r exits with status r * 3 (rank 0 succeeds), after printing its rank.

``exit_codes.py DIR``: rank 0 leaves its process id in DIR, and rank 1 exits only once
that process has ended. horovodrun stops the other ranks as soon as one fails, so
without this ordering a slow-starting rank 0 could be killed before recording its 0.
"""

import os
import sys
import time
from pathlib import Path

from hvdtrain.jobs.launch import process_alive
from hvdtrain.runtime import launcher_rank

rank = launcher_rank()
pid_file = Path(sys.argv[1]) / "rank-0.pid"
print(f"rank {rank} says hello")
if rank == 0:
    pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
    pid_file.with_suffix(".tmp").rename(pid_file)
else:
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rank_zero = int(pid_file.read_text())
    while process_alive(rank_zero) and time.monotonic() < deadline:
        time.sleep(0.05)
sys.exit(rank * 3)
