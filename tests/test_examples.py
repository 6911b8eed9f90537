"""The examples a user copies, run as the README runs them: horovodrun -np 2."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.jobs.launch import CONTROLLERS, horovodrun_path, run_workers

EXAMPLES = Path(__file__).parents[1] / "examples"
EPOCH_LINE = re.compile(r"^epoch\s+(\d+)/(\d+)\s+lr ([\d.]+)\s+train loss ([\d.]+)\s+"
                        r"test accuracy ([\d.]+)")
CHECKSUM_LINE = re.compile(r"final state fingerprint ([0-9a-f]{8})")
SEED_LINES = ["worker0_local_step [0.94, -0.98]", "allreduced_step [0.96, -1.01]",
              "gradient_mean [0.4, 0.1]"]


def train(tmp_path, controller, *args):
    result = run_workers(EXAMPLES / "torch_train.py",
                         ["--checkpoint", str(tmp_path / "run.pt"), *args],
                         controller=controller, timeout=180).check()
    root = result.ranks[0].output.splitlines()
    epochs = [m for m in map(EPOCH_LINE.search, root) if m]
    checksum = next(m[1] for m in map(CHECKSUM_LINE.search, root) if m)
    return result, epochs, checksum


def test_torch_train_learns_and_only_rank_0_prints(tmp_path, controller):
    result, epochs, _ = train(tmp_path, controller, "--epochs", "10")
    assert [int(m[1]) for m in epochs] == list(range(1, 11))
    losses = [float(m[4]) for m in epochs]
    assert losses[-1] < losses[0] / 3
    assert float(epochs[-1][5]) >= 0.9
    assert "replicas identical" in result.ranks[0].output
    assert "25% (" in result.ranks[0].output  # the progress line, rank 0 only
    assert result.ranks[1].output.strip() == ""


# What TensorFlow's native start-up log looks like (absl's preamble, its CPU notes).
TENSORFLOW_LOG = re.compile(r"absl::InitializeLog|cpu_feature_guard|oneDNN|This TensorFlow binary")


def test_the_demo_screen_is_clean_and_its_progress_lines_whole(tmp_path):
    """`make demo`'s own command line: no TensorFlow start-up log from the launcher (whose
    build check imports TensorFlow; scripts/patches/horovod/0001-quiet-extension-check.patch),
    and each progress line arrives whole, tagged once, before its epoch's result."""
    done = subprocess.run(
        [horovodrun_path(), "-np", "2", "--mpi", sys.executable,
         str(EXAMPLES / "torch_train.py"), "--epochs", "2",
         "--checkpoint", str(tmp_path / "demo.pt")],
        capture_output=True, text=True, timeout=240, env={**os.environ})
    assert done.returncode == 0, done.stdout + done.stderr
    screen = (done.stdout + done.stderr).splitlines()
    assert not [line for line in screen if TENSORFLOW_LOG.search(line)], screen[:5]
    broken = [line for line in done.stdout.splitlines()
              if line.count("<stdout>:") != 1 or line.endswith("<stdout>:")]
    assert not broken, broken[:5]
    rank0 = [line.removeprefix("[1,0]<stdout>:") for line in done.stdout.splitlines()
             if line.startswith("[1,0]<stdout>:")]
    first_epoch = rank0[rank0.index(next(line for line in rank0 if EPOCH_LINE.search(line)))
                        - 3:][:4]
    assert [line.split(" (")[0] for line in first_epoch[:3]] == [
        "epoch 1/2 25%", "epoch 1/2 50%", "epoch 1/2 75%"]
    assert EPOCH_LINE.search(first_epoch[3])


def test_torch_train_resume_matches_an_uninterrupted_run(tmp_path):
    _, _, straight = train(tmp_path / "straight", "gloo", "--epochs", "6")
    train(tmp_path / "interrupted", "gloo", "--epochs", "4")
    _, resumed_epochs, resumed = train(tmp_path / "interrupted", "gloo", "--epochs", "6",
                                       "--resume")
    assert [int(m[1]) for m in resumed_epochs] == [5, 6]
    assert resumed == straight


# script -> (controllers it runs under, times it prints the step: once per code path)
SEED_EXAMPLES = {
    "seed_allreduce_numpy.py": (("mpi",), 1),
    "seed_allreduce_torch.py": (CONTROLLERS, 1),
    "seed_allreduce_tf.py": (CONTROLLERS, 2),  # DistributedGradientTape, Keras optimizer
}


def seed_blocks(output: str) -> int:
    lines = output.splitlines()
    return sum(lines[i:i + 3] == SEED_LINES for i in range(len(lines)))


@pytest.mark.parametrize(("script", "controller"), [
    (script, controller) for script, (controllers, _) in SEED_EXAMPLES.items()
    for controller in controllers
])
def test_every_seed_example_prints_the_textbook_step_on_every_rank(script, controller):
    result = run_workers(EXAMPLES / script, controller=controller, timeout=120).check()
    for rank in result.ranks:
        assert seed_blocks(rank.output) == SEED_EXAMPLES[script][1], rank.output


def test_numpy_seed_example_under_plain_mpirun():
    done = subprocess.run(
        ["mpirun", "-np", "2", sys.executable, str(EXAMPLES / "seed_allreduce_numpy.py")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
    )
    assert done.returncode == 0, done.stderr
    for line in SEED_LINES:
        assert done.stdout.count(line) == 2  # once per rank


def test_keras_train_learns_with_averaged_metrics_on_rank_0_only():
    result = run_workers(EXAMPLES / "keras_train.py", ["--epochs", "8"], timeout=180).check()
    epochs = re.findall(r"accuracy: ([\d.]+) - loss: ([\d.]+) - val_accuracy: ([\d.]+)",
                        result.ranks[0].output)
    assert len(epochs) == 8
    assert float(epochs[-1][1]) < float(epochs[0][1]) / 3
    assert float(epochs[-1][2]) >= 0.9
    assert "val_accuracy" not in result.ranks[1].output


def test_a_horovod_keras_script_runs_with_only_its_import_changed():
    code_after_docstring = (EXAMPLES / "horovod_keras.py").read_text().split('"""', 2)[2]
    code = [line for line in code_after_docstring.splitlines() if "hvdtrain" in line]
    assert code == ["import hvdtrain.adapters.keras as hvd  # was: import horovod.tensorflow."
                    "keras as hvd"]
    result = run_workers(EXAMPLES / "horovod_keras.py", ["--epochs", "6"], timeout=180).check()
    summary = re.search(r"final accuracy ([\d.]+) on 2 workers, replicas identical",
                        result.ranks[0].output)
    assert summary and float(summary[1]) >= 0.9, result.ranks[0].output[-2000:]
    assert "finished gradual learning rate warmup to 0.04" in result.ranks[0].output
    assert "final accuracy" not in result.ranks[1].output


@pytest.mark.parametrize(("controller", "passes"), [("mpi", 1), ("gloo", 2)])
def test_tf_custom_loop_learns_with_identical_replicas(controller, passes):
    result = run_workers(EXAMPLES / "tf_custom_loop.py",
                         ["--epochs", "8", "--backward-passes-per-step", str(passes)],
                         controller=controller, timeout=180).check()
    epochs = re.findall(r"train loss ([\d.]+)\s+val accuracy ([\d.]+)  \(replicas identical\)",
                        result.ranks[0].output)
    assert len(epochs) == 8
    assert float(epochs[-1][0]) < float(epochs[0][0]) / 3
    assert float(epochs[-1][1]) >= 0.9


@pytest.mark.parametrize("script", ["torch_train.py", "keras_train.py", "tf_custom_loop.py"])
def test_training_examples_run_without_a_launcher_as_one_worker(script, tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--epochs", "2",
         *(["--checkpoint", str(tmp_path / "run.pt")] if script == "torch_train.py" else [])],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    notices = [line for line in done.stderr.splitlines() if line.startswith("hvdtrain:")]
    assert notices == ["hvdtrain: no launcher (horovodrun/mpirun) detected; "
                       "running as a single worker"]


ELASTIC_SUMMARY = re.compile(r"^workers 3 -> 2 at step (\d+), lr ([\d.]+) -> ([\d.]+), "
                             r"replicas identical, done$")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("example", ["torch_elastic.py", "keras_elastic.py"])
def test_the_elastic_demo_loses_a_worker_and_finishes_on_two(example):
    """`python examples/<example> --demo`, as the README runs it: 3 workers (digits, 32 per
    worker, η = 0.05 for 32, 2 warmup epochs), rank 2 killed at step 17. The LR after
    the loss is the 2-worker rule at the commit it rolled back to."""
    done = subprocess.run([sys.executable, str(EXAMPLES / example), "--demo"],
                          capture_output=True, text=True, timeout=220, env={**os.environ})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = ELASTIC_SUMMARY.match(done.stdout.splitlines()[-1])
    assert summary, done.stdout[-2000:]
    step, after = int(summary[1]), float(summary[3])
    assert step % 5 == 0 and step < 17  # the last commit (every 5 steps) before the kill
    samples_per_epoch = 19 * 3 * 32  # 1,797 digits over 3 workers: 19 batches each
    epoch = step * 3 * 32 / samples_per_epoch
    assert after == pytest.approx(0.05 + (2 * 0.05 - 0.05) * epoch / 2, abs=5e-5)


def test_every_package_the_examples_import_comes_with_an_extra():
    """A user who installs hvdtrain with its extras (docs/setup.md) can run every example:
    each third-party import in examples/ is in setup.cfg's extras (by import name)."""
    import ast
    import configparser

    root = Path(__file__).resolve().parents[1]
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    extras = {line.strip() for value in config["options.extras_require"].values()
              for line in value.splitlines() if line.strip()}
    import_names = {"scikit-learn": "sklearn", "tensorflow-cpu": "tensorflow"}
    provided = {import_names.get(name, name) for name in extras} | {"keras", "numpy", "horovod"}
    examples = root / "examples"
    local = {path.stem for path in examples.rglob("*.py")}
    imported = set()
    for path in examples.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - local - {"hvdtrain", "__future__"}
    assert third_party and third_party <= provided, third_party - provided
    assert "scikit-learn" in config["options.extras_require"]["examples"]
