"""Benchmark 10: Horovod over rate-limited links, the alpha-beta ring model fitted to it, and
that model's projection to 256 workers.

Four hosts on this machine, each a network namespace with its own sshd, host name and
address (tests/ssh_hosts.py), joined by a bridge; every host's link is limited by tc's
token bucket to 1 Gbit/s or 5 Gbit/s each way. Jobs are launched as on a cluster:
``horovodrun -H host-a:1,host-b:1,...`` from the first host; PyTorch DDP by ``torchrun``
on each host. The ranks still share this machine's 2 cores, and the latency is the
machine's (this kernel has no netem), so alpha here is mostly the collectives' own cost.

1. Collectives (network_worker.py): allreduce, reduce-scatter and allgather time
   against size on 2 and 4 hosts, Gloo and MPI, at each rate; launches interleaved
   over rounds, medians per point. The ring's alpha and beta are fitted per controller and
   rate (ring_model.py), and the bus bandwidth at the largest size is set against the
   link's rate, with how busy the machine's CPUs were meanwhile (the emulated links
   are forwarded and shaped in their interrupts).
2. Training at 1 Gbit/s (step_worker.py, ddp_worker.py): hvdtrain flat, overlapped (two
   buckets started during backward), with fp16 and bf16 on the wire, and DDP, on 2
   hosts; hvdtrain flat on 4 hosts and on 1; interleaved over rounds.
3. The model checked: fitted on the 2-host collectives alone, it predicts the 4-host
   allreduce of each model's gradients and the 4-host step (the launch's own compute
   plus the predicted allreduce), set against the measurement.
4. The projection: each model's step and efficiency at 8 to 256 workers (compute from
   the 1-rank launch), and ResNet-50-sized gradients at a stated compute time, flat,
   overlapped and overlapped with bf16, next to Horovod's and Goyal et al.'s published
   efficiencies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    HERE,
    ONE_THREAD,
    interleaved,
    markdown_table,
    median,
    median_ratio,
    ms,
    parse_result,
    pyplot,
    write_result,
)
from ring_model import RingLinks, StepModel, fit_ring

from hvdtrain.jobs.launch import horovodrun_path

sys.path.insert(0, str(HERE.parent / "tests"))
from ssh_hosts import SshHosts, why_unavailable

HOSTS = ("host-a", "host-b", "host-c", "host-d")
CONTROLLERS = ("gloo", "mpi")
RATES_MBIT = (1000, 5000)
TRAIN_RATE_MBIT = 1000
MODELS = ("conv", "convdense", "wide")
WORKER_COUNTS = (8, 16, 32, 64, 128, 256)
# ResNet-50's gradients and a stated compute time per step: 32 images per worker at
# about 128 images/s, the order of a P100 in Goyal et al. 2017 (256 GPUs, 8k images per
# step of about 0.26 s, communication included).
RESNET50 = {"parameters": 25_557_032, "compute_s": 0.25, "batch_per_worker": 32}
PUBLISHED = {  # scaling efficiency, as published
    "Horovod, Inception V3 and ResNet-101, 512 GPUs, 25 Gbit/s RoCE": 0.90,
    "Horovod, VGG-16, 512 GPUs, 25 Gbit/s RoCE": 0.68,
    "Goyal et al., ResNet-50, 8 to 256 GPUs": 0.90,
}
# The model's allowed error against the 4-host measurement (allreduce of the gradients).
TARGET_MODEL_ERROR = 0.25
MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
TRAINING = {  # contender -> (hosts, controller, step_worker mode, compression); None: DDP
    "hvdtrain gloo flat": (2, "gloo", "auto", "none"),
    "hvdtrain gloo overlap": (2, "gloo", "buckets", "none"),
    "hvdtrain gloo fp16": (2, "gloo", "auto", "fp16"),
    "hvdtrain gloo bf16": (2, "gloo", "auto", "bf16"),
    "hvdtrain mpi flat": (2, "mpi", "auto", "none"),
    "DDP gloo": (2, None, None, None),
    "hvdtrain gloo flat, 4 hosts": (4, "gloo", "auto", "none"),
    "hvdtrain mpi flat, 4 hosts": (4, "mpi", "auto", "none"),
    "1 rank": (1, None, "auto", "none"),
}





def _environment() -> dict[str, str]:
    return {**os.environ, **ONE_THREAD, **MPI_AS_ROOT}


def _horovod(hosts: SshHosts, count: int, controller: str, script: str, args: list[str],
             timeout: float = 900) -> dict:
    """``benchmarks/<script>`` on the first ``count`` hosts, one rank each. Each rank's
    output goes to a file of its own (the launcher's merged stream can split a long
    line under MPI)."""
    names = hosts.names[:count]
    with tempfile.TemporaryDirectory(prefix="hvdtrain-ranks-") as ranks:
        command = hosts.on(names[0], [
            horovodrun_path(), f"--{controller}", "-np", str(count),
            "-H", ",".join(f"{name}:1" for name in names),
            "--network-interfaces", hosts.interface, "--ssh-identity-file", str(hosts.key),
            sys.executable, "-m", "hvdtrain.jobs._rank_entry", ranks, str(HERE / script),
            *args])
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=_environment(), cwd=HERE)
        first = Path(ranks, "rank-0.log")
        output = first.read_text(errors="replace") if first.exists() else ""
    if done.returncode != 0:
        raise RuntimeError(f"{script} on {count} hosts ({controller}) exited "
                           f"{done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}\n"
                           f"rank 0:\n{output[-3000:]}")
    return parse_result(output, script)


def _ddp(hosts: SshHosts, count: int, args: list[str], timeout: float = 900) -> dict:
    """ddp_worker.py by torchrun on each of the first ``count`` hosts (Gloo)."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    names = hosts.names[:count]
    master = hosts.addresses[names[0]]
    processes = [subprocess.Popen(
        hosts.on(name, [torchrun, f"--nnodes={count}", "--nproc-per-node=1",
                        f"--node-rank={rank}", f"--master-addr={master}",
                        "--master-port=29617", str(HERE / "ddp_worker.py"), *args]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE,
        env={**_environment(), "GLOO_SOCKET_IFNAME": hosts.interface})
        for rank, name in enumerate(names)]
    outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    if any(process.returncode != 0 for process in processes):
        raise RuntimeError("DDP across hosts failed:\n" + "\n".join(o[-2000:] for o in outputs))
    return parse_result(outputs[0], "ddp_worker.py")


def _one_rank(hosts: SshHosts, args: list[str], timeout: float = 900) -> dict:
    done = subprocess.run(hosts.on(hosts.names[0], [sys.executable,
                                                    str(HERE / "step_worker.py"), *args]),
                          capture_output=True, text=True, timeout=timeout,
                          env=_environment(), cwd=HERE)
    if done.returncode != 0:
        raise RuntimeError(f"step_worker.py alone exited {done.returncode}:\n"
                           f"{done.stderr[-3000:]}")
    return parse_result(done.stdout, "step_worker.py")


def measure_collectives(hosts: SshHosts, max_bytes: int, budget_s: float, rounds: int,
                        host_counts: tuple[int, ...], rates: tuple[int, ...]) -> dict:
    """Per (rate, hosts, controller): the median time of each point over the rounds."""
    def launch(rate: int, count: int, controller: str):
        def run() -> dict:
            hosts.limit_rate(rate)
            return _horovod(hosts, count, controller, "network_worker.py",
                            [str(max_bytes), str(budget_s)])
        return run

    contenders = {f"{rate} Mbit/s, {count} hosts, {controller}": launch(rate, count, controller)
                  for rate in rates for count in host_counts for controller in CONTROLLERS}
    measured = interleaved(contenders, rounds, "collectives")
    table = {}
    for key, results in measured.items():
        points = []
        for index, point in enumerate(results[0]["points"]):
            times = [result["points"][index]["seconds"] for result in results]
            points.append({**point, "seconds": median(times),
                           "bus_bandwidth_gbit_s": point["bus_bandwidth_gbit_s"]
                           * point["seconds"] / median(times),
                           **{share: median([result["points"][index][share]
                                             for result in results])
                              for share in ("cpu_busy", "cpu_interrupts")}})
        table[key] = {"workers": results[0]["workers"], "points": points}
    return table


def measure_training(hosts: SshHosts, steps: int, rounds: int, models: tuple[str, ...],
                     contenders: dict) -> dict[str, list[dict]]:
    hosts.limit_rate(TRAIN_RATE_MBIT)
    names = ",".join(models)

    def launch(count: int, controller: str | None, mode: str | None, wire: str | None):
        if count == 1:
            return lambda: _one_rank(hosts, [names, str(steps), mode, wire])
        if controller is None:
            return lambda: _ddp(hosts, count, [names, str(steps)])
        return lambda: _horovod(hosts, count, controller, "step_worker.py",
                                [names, str(steps), mode, wire])

    return interleaved({name: launch(*how) for name, how in contenders.items()}, rounds,
                       "training at 1 Gbit/s")


def _points(collectives: dict, rate: int, controller: str, counts: tuple[int, ...]):
    for key, entry in collectives.items():
        if key.startswith(f"{rate} Mbit/s,") and key.endswith(f", {controller}") \
                and entry["workers"] in counts:
            for p in entry["points"]:
                yield p["operation"], entry["workers"], p["bytes"], p["seconds"]


def run(folder: Path, smoke: bool) -> dict:
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"benchmark network needs hosts with sshd here: {reason}")
    # Stopped with SIGTERM, unwind, so that the hosts (namespaces, sshd) are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if smoke:
        max_bytes, budget_s, rounds, steps, models = 2**18, 0.02, 1, 2, MODELS[:1]
        host_counts, rates = (2,), (TRAIN_RATE_MBIT,)
        contenders = {k: TRAINING[k] for k in ("hvdtrain gloo flat", "DDP gloo", "1 rank")}
    else:
        max_bytes, budget_s, rounds, steps, models = 2**24, 0.3, 5, 8, MODELS
        host_counts, rates, contenders = (2, 4), RATES_MBIT, TRAINING
    with tempfile.TemporaryDirectory(prefix="hvdtrain-network-") as directory, \
            SshHosts(Path(directory), HOSTS[:max(host_counts)]) as hosts:
        collectives = measure_collectives(hosts, max_bytes, budget_s, rounds, host_counts,
                                          rates)
        training = measure_training(hosts, steps, rounds, models, contenders)
    summary = summarize(collectives, training, contenders, models, host_counts, rates)
    settings = {"hosts": list(HOSTS[:max(host_counts)]), "host_counts": list(host_counts),
                "rates_mbit_s": list(rates),
                "training_rate_mbit_s": TRAIN_RATE_MBIT, "max_bytes": max_bytes,
                "seconds_per_point": budget_s, "rounds": rounds, "steps": steps,
                "models": list(models), "resnet50": RESNET50, "smoke": smoke}
    write_result(folder, "network", settings, summary)
    _plot(folder / "network.png", summary)
    return summary


def summarize(collectives: dict, training: dict[str, list[dict]], contenders: dict,
              models: tuple[str, ...], host_counts: tuple[int, ...],
              rates: tuple[int, ...]) -> dict:
    """The fits, the training table, the model's check and the projection."""
    fits = {}
    largest = max(p["bytes"] for p in next(iter(collectives.values()))["points"])
    for rate in rates:
        for controller in CONTROLLERS:
            links = fit_ring(_points(collectives, rate, controller, host_counts))
            at_largest = {str(count): next(
                p for p in collectives[f"{rate} Mbit/s, {count} hosts, {controller}"]["points"]
                if p["operation"] == "allreduce" and p["bytes"] == largest)
                for count in host_counts}
            fits[f"{rate} {controller}"] = {
                "rate_mbit_s": rate, "controller": controller, "alpha_s": links.alpha_s,
                "beta_s_per_byte": links.beta_s_per_byte,
                "fitted_gbit_s": links.bandwidth_gbit_s,
                **{field: {count: point[field] for count, point in at_largest.items()}
                   for field in ("bus_bandwidth_gbit_s", "cpu_busy", "cpu_interrupts")}}
    steps = {}
    for model in models:
        steps[model] = {}
        for name, results in training.items():
            runs = [r["models"][model] for r in results]
            steps[model][name] = {"hosts": contenders[name][0],
                                  "median_step_s": median([r["median_step_s"] for r in runs])}
            if "median_compute_s" in runs[0]:
                steps[model][name]["median_compute_s"] = median(
                    [r["median_compute_s"] + r["median_update_s"] for r in runs])
                if "median_allreduce_alone_s" in runs[0]:
                    steps[model][name]["median_allreduce_alone_s"] = median(
                        [r["median_allreduce_alone_s"] for r in runs])
            if "DDP gloo" in training and contenders[name][0] == 2:
                steps[model][name]["ratio_to_ddp"] = median_ratio(
                    [r["median_step_s"] for r in runs],
                    [r["models"][model]["median_step_s"] for r in training["DDP gloo"]])
        steps[model]["parameters"] = training["1 rank"][0]["models"][model]["parameters"]
    return {"collectives": collectives, "fits": fits, "training": steps,
            "training_rounds": training,
            "model_check": check_model(collectives, steps, models, host_counts),
            "projection": project(fits, steps, models)}


def check_model(collectives: dict, steps: dict, models: tuple[str, ...],
                host_counts: tuple[int, ...]) -> list[dict]:
    """alpha and beta fitted on 2 hosts at the training rate predict the 4-host allreduce of
    each model's gradients (measured alone) and its step (measured compute + predicted
    allreduce); each with its relative error."""
    checks = []
    for controller in CONTROLLERS:
        links = fit_ring(_points(collectives, TRAIN_RATE_MBIT, controller, (2,)))
        for count in host_counts:
            launch = f"hvdtrain {controller} flat" + (f", {count} hosts" if count > 2 else "")
            for model in models:
                measured = steps[model].get(launch)
                if measured is None or "median_allreduce_alone_s" not in measured:
                    continue
                nbytes = 4 * steps[model]["parameters"]
                allreduce = links.allreduce_s(count, nbytes)
                step = measured["median_compute_s"] + allreduce
                checks.append({
                    "controller": controller, "hosts": count, "model": model,
                    "predicted_allreduce_s": allreduce,
                    "measured_allreduce_s": measured["median_allreduce_alone_s"],
                    "allreduce_error": allreduce / measured["median_allreduce_alone_s"] - 1,
                    "predicted_step_s": step, "measured_step_s": measured["median_step_s"],
                    "step_error": step / measured["median_step_s"] - 1})
    return checks


def project(fits: dict, steps: dict, models: tuple[str, ...]) -> list[dict]:
    """Each model's efficiency at WORKER_COUNTS on each fitted link: flat, overlapped,
    overlapped with bf16 on the wire; compute from the 1-rank launch."""
    workloads = {model: StepModel(steps[model]["1 rank"]["median_compute_s"],
                                  4 * steps[model]["parameters"]) for model in models}
    workloads["resnet50-sized"] = StepModel(RESNET50["compute_s"], 4 * RESNET50["parameters"])
    rows = []
    for model, workload in workloads.items():
        for fit in fits.values():
            links = RingLinks(fit["alpha_s"], fit["beta_s_per_byte"])
            rows.append({"model": model, "link": f"{fit['controller']} "
                         f"{fit['rate_mbit_s'] / 1000:g} Gbit/s",
                         "compute_s": workload.compute_s,
                         "gradient_bytes": workload.gradient_bytes,
                         "efficiency": {str(n): {
                             "flat": workload.efficiency(links, n),
                             "overlap": workload.efficiency(links, n, overlap=True),
                             "overlap_bf16": workload.efficiency(links, n, overlap=True,
                                                                 compressed=True)}
                             for n in WORKER_COUNTS}})
    return rows


def _plot(path: Path, summary: dict) -> None:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, entry in summary["collectives"].items():
        if not key.startswith(f"{TRAIN_RATE_MBIT} Mbit/s"):
            continue
        fit = summary["fits"][f"{TRAIN_RATE_MBIT} {key.rsplit(', ', 1)[1]}"]
        links = RingLinks(fit["alpha_s"], fit["beta_s_per_byte"])
        points = [p for p in entry["points"] if p["operation"] == "allreduce"]
        sizes = [p["bytes"] for p in points]
        line, = left.plot(sizes, [p["seconds"] for p in points], "o", label=key)
        left.plot(sizes, [links.allreduce_s(entry["workers"], n) for n in sizes], "-",
                  color=line.get_color())
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("allreduce buffer (bytes)")
    left.set_ylabel("seconds (points: measured; lines: fitted ring)")
    left.legend(fontsize=7)
    left.set_title(f"allreduce at {TRAIN_RATE_MBIT / 1000:g} Gbit/s per link")
    for row in summary["projection"]:
        if row["model"] == "resnet50-sized" and row["link"].startswith("gloo"):
            counts = [int(n) for n in row["efficiency"]]
            for variant, style in (("flat", "-"), ("overlap_bf16", "--")):
                right.plot(counts, [row["efficiency"][str(n)][variant] for n in counts],
                           style, marker="o", label=f"{row['link']}, {variant}")
    published: dict[float, list[str]] = {}
    for label, value in PUBLISHED.items():
        published.setdefault(value, []).append(label)
    for value, labels in published.items():
        right.axhline(value, color="grey", linestyle=":", linewidth=1)
        right.annotate("\n".join(labels), (8, value), fontsize=6, va="bottom")
    right.set_xscale("log", base=2)
    right.set_ylim(0, 1.05)
    right.set_xlabel("workers")
    right.set_ylabel("projected scaling efficiency")
    right.set_title("ResNet-50-sized gradients, ring model")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    return [(f"the ring model fitted on 2 hosts predicts the {c['hosts']}-host allreduce of "
             f"{c['model']}'s gradients ({c['controller']}) within "
             f"{TARGET_MODEL_ERROR:.0%}: off by {c['allreduce_error']:+.0%}",
             abs(c["allreduce_error"]) <= TARGET_MODEL_ERROR)
            for c in summary["model_check"] if c["hosts"] > 2 and c["model"] != "conv"]


def tables(result: dict) -> str:
    """The report's tables (Markdown) from ``network.json``."""
    counts = [str(n) for n in result["settings"]["host_counts"]]
    fits = markdown_table(
        ["link", "controller", "alpha (per message)", "fitted bandwidth",
         *(f"largest allreduce, {n} hosts: bus bandwidth (CPU busy, in interrupts)"
           for n in counts)],
        [[f"{f['rate_mbit_s'] / 1000:g} Gbit/s", f["controller"], f"{1e6 * f['alpha_s']:.0f} µs",
          f"{f['fitted_gbit_s']:.2f} Gbit/s",
          *(f"{f['bus_bandwidth_gbit_s'][n]:.2f} Gbit/s ({f['cpu_busy'][n]:.0%}, "
            f"{f['cpu_interrupts'][n]:.0%})" for n in counts)]
         for f in result["fits"].values()])
    training = result["training"]
    contenders = [name for name in next(iter(training.values())) if name != "parameters"]
    steps = markdown_table(
        ["contender", *(f"{m} ({training[m]['parameters'] / 1e6:.2f} M)" for m in training)],
        [[name, *(ms(training[m][name]["median_step_s"])
                  + (f" ({training[m][name]['ratio_to_ddp']:.2f}x DDP)"
                     if "ratio_to_ddp" in training[m][name] else "") for m in training)]
         for name in contenders])
    check = markdown_table(
        ["controller", "hosts", "model", "allreduce predicted / measured", "error",
         "step predicted / measured", "error"],
        [[c["controller"], c["hosts"], c["model"],
          f"{ms(c['predicted_allreduce_s'])} / {ms(c['measured_allreduce_s'])}",
          f"{c['allreduce_error']:+.0%}",
          f"{ms(c['predicted_step_s'])} / {ms(c['measured_step_s'])}",
          f"{c['step_error']:+.0%}"] for c in result["model_check"]])
    workers = [str(n) for n in WORKER_COUNTS]
    projection = markdown_table(
        ["model (compute per step, gradients)", "link", *(f"N = {n}" for n in workers)],
        [[f"{r['model']} ({ms(r['compute_s'])}, {r['gradient_bytes'] / 1e6:.1f} MB)",
          r["link"], *(" / ".join(f"{r['efficiency'][n][v]:.2f}"
                                  for v in ("flat", "overlap", "overlap_bf16"))
                       for n in workers)] for r in result["projection"]])
    return "\n\n".join([fits, steps, check, "Projected efficiency (flat / overlapped / "
                        "overlapped with bf16):\n\n" + projection])
