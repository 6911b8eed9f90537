"""hvdtrain's benchmarks: ``python benchmarks/run.py [--smoke] [--only NAME ...]``
(``make bench`` runs them all).

Each benchmark (see its module) measures its contenders interleaved within one run,
over at least 5 rounds, and writes ``benchmarks/results/<name>.json`` (with the
machine, the versions and the exact settings) and a PNG plot; at the end a summary
says which targets were met, and ``report.py`` regenerates the tables of
``benchmarks/README.md`` and the README's summary from the results. ``--smoke`` runs a
tiny version of each (seconds) that only checks they still work, writing to a temporary
folder (with a copy of ``benchmarks/README.md`` rendered from the smoke results).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
from pathlib import Path

import report
from common import HERE, progress

BENCHMARKS = ("overhead", "ddp", "scaling", "bandwidth", "keras_throughput", "goyal",
              "sharding", "allocator", "bfloat16", "network")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny runs, results not kept")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=BENCHMARKS,
                        help="run only these benchmarks")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hvdtrain-bench-")) if args.smoke \
        else HERE / "results"
    folder.mkdir(parents=True, exist_ok=True)
    verdicts = []
    for name in args.only:
        progress(f"== {name}")
        module = importlib.import_module(name)
        verdicts += module.targets(module.run(folder, args.smoke))
    progress("targets:")
    for description, met in verdicts:
        progress(f"  [{'met' if met else 'MISSED'}] {description}")
    if args.smoke:
        page = Path(shutil.copy(HERE / "README.md", folder / "README.md"))
        report.update(folder, (page,))
    else:
        report.update(folder)
    print(f"results: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
