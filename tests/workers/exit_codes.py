"""Rank r exits with status r * 3 (rank 0 succeeds), after printing its rank."""

import os
import sys

rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
print(f"rank {rank} says hello")
sys.exit(rank * 3)
