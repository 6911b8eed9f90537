"""An elastic job (``horovodrun --min-np/--max-np --host-discovery-script``) that a third
worker joins: ``python torch_elastic_join.py HOSTS_FILE``.

Starts on 2 workers with hvdtrain's DistributedOptimizer inside Horovod's
``hvd.elastic.run``; after step 20 is committed, rank 0 rewrites HOSTS_FILE (which the
discovery script prints) to offer a third slot. Every worker prints one ``REPORT
{json}`` line per committed step (its rank, the world size, the step and its weights'
fingerprint) and a last one when training ends.
"""

import sys
import time
from pathlib import Path

import horovod.torch as horovod_torch
import torch
from scenarios import report

import hvdtrain.adapters.torch as hvt

STEPS, COMMIT_EVERY, GROW_AFTER = 80, 10, 20
HOSTS = Path(sys.argv[1])


def main() -> None:
    hvt.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvt.rank())  # different until the elastic state syncs them
    model = torch.nn.Linear(4, 1)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         model.named_parameters())

    @horovod_torch.elastic.run
    def train(state) -> None:
        while state.step < STEPS:
            inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(
                state.step * 100 + hvt.rank()))
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()
                report(hvt.rank(), "commit", size=hvt.size(), step=state.step,
                       fingerprint=hvt.state_fingerprint(model))
                if state.step == GROW_AFTER and hvt.rank() == 0 and hvt.size() == 2:
                    HOSTS.write_text("localhost:3\n")
            time.sleep(0.05)  # leave the driver time to notice the new slot

    state = horovod_torch.elastic.TorchState(model, optimizer, step=0)
    train(state)
    report(hvt.rank(), "done", size=hvt.size(), fingerprint=hvt.state_fingerprint(model))


if __name__ == "__main__":
    main()
