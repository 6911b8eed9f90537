"""One process, no launcher (so Horovod runs as a single worker): ``python
checkpoint_single.py MODE FOLDER``.

loop:   save checkpoints to FOLDER/ckpt.pt forever, every parameter set to the step
        number before each save; prints "saved N" after each.
errors: tries to load an empty, a truncated, a foreign and an unsafe file; prints
        ``REPORT {json}`` with each error message.
resize: loads FOLDER/four_workers.pt (a scheduler state saved by 4 workers) with a
        LinearScalingWarmup of this 1-worker job; prints ``REPORT {json}`` with its
        world size, samples seen and learning rate.
"""

import json
import sys
from pathlib import Path

import torch

import hvdtrain.adapters.torch as hvt

MODE, FOLDER = sys.argv[1], Path(sys.argv[2])
hvt.init()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))

if MODE == "resize":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=4, base_batch_size=2,
                                        steps_per_epoch=60, warmup_epochs=2)
    hvt.load_checkpoint(FOLDER / "four_workers.pt", model, optimizer, scheduler)
    print("REPORT " + json.dumps({"world_size": scheduler.world_size,
                                  "samples_seen": scheduler.samples_seen,
                                  "lr": optimizer.param_groups[0]["lr"]}), flush=True)
    sys.exit(0)

if MODE == "loop":
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(step))
        hvt.save_checkpoint(FOLDER / "ckpt.pt", model, step=step)
        print(f"saved {step}", flush=True)

hvt.save_checkpoint(FOLDER / "good.pt", model, step=1)
good = (FOLDER / "good.pt").read_bytes()
(FOLDER / "empty.pt").write_bytes(b"")
(FOLDER / "truncated.pt").write_bytes(good[: len(good) // 2])
torch.save({"weights": torch.ones(2)}, FOLDER / "foreign.pt")
torch.save({"format": "hvdtrain.torch/1", "model": model.state_dict(), "extra": {},
            "optimizer": None, "scheduler": None, "payload": Path("x")}, FOLDER / "unsafe.pt")
errors = {}
for name in ("empty", "truncated", "foreign", "unsafe", "missing"):
    try:
        hvt.load_checkpoint(FOLDER / f"{name}.pt", model)
        errors[name] = None
    except RuntimeError as error:
        errors[name] = str(error)
print("REPORT " + json.dumps(errors), flush=True)
