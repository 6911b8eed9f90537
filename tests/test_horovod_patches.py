"""hvdtrain's patches to Horovod (scripts/patches/horovod/), each checked on the installed
build by the behaviour it changes."""

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import launch, reports

from hvdtrain import horovod_patches
from hvdtrain.jobs.launch import CONTROLLERS, horovodrun_path
from hvdtrain.jobs.local_hosts import LocalHosts

PATCHES = Path(__file__).parents[1] / "scripts" / "patches" / "horovod"


def test_hvdtrain_knows_each_patch_by_its_file_name():
    """hvdtrain.horovod_patches lists what each patch's absence costs; every patch file is
    listed there and nothing else is."""
    assert [patch.name for patch in horovod_patches.PATCHES] == sorted(
        path.stem for path in PATCHES.glob("*.patch"))


def test_the_installed_build_carries_a_marker_naming_every_patch():
    """scripts/build-horovod.sh writes horovod/hvdtrain_patches.py into the patched build."""
    assert horovod_patches.read_marker() == {patch.name for patch in horovod_patches.PATCHES}


def test_the_marker_is_read_without_importing_horovod(tmp_path):
    stock, patched = tmp_path / "stock", tmp_path / "patched"
    stock.mkdir()
    patched.mkdir()
    (patched / horovod_patches.MARKER).write_text('"""Marker."""\n\nPATCHES = (\n    "a",\n'
                                                  '    "b",\n)\n')
    assert horovod_patches.read_marker([str(stock)]) == frozenset()
    assert horovod_patches.read_marker([str(stock), str(patched)]) == {"a", "b"}


def test_the_notice_names_what_is_missing_what_it_costs_and_the_fix():
    missing = horovod_patches.missing_patches(frozenset(
        patch.name for patch in horovod_patches.PATCHES if patch.name != "0005-stateful-join"))
    assert [patch.name for patch in missing] == ["0005-stateful-join"]
    notice = horovod_patches.missing_patches_notice(missing)
    assert "\n" not in notice
    assert "patches 0005-stateful-join: training is correct, but JoinAtEpochEnd" in notice
    assert horovod_patches.BUILD_COMMAND in notice


def test_every_patch_says_why_in_its_first_line():
    patches = sorted(PATCHES.glob("*.patch"))
    assert patches
    for patch in patches:
        assert patch.read_text().startswith("Why: "), patch.name


def test_0001_the_launchers_extension_check_mutes_native_output_too():
    """horovodrun asks each framework extension, in a forked child, whether Horovod was
    built with MPI or Gloo; TensorFlow's import logs through the file descriptors, not
    sys.stderr. The check here writes to both descriptors natively from inside the
    child, as TensorFlow's C++ logging does, and nothing may reach the parent's."""
    script = textwrap.dedent("""
        import os
        from horovod.common.util import _check_extension_lambda

        def noisy(extension):
            os.write(1, b"NATIVE STDOUT\\n")
            os.write(2, b"NATIVE STDERR\\n")
            return True

        print("result", _check_extension_lambda("torch", noisy, "checked", False), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "result True" in done.stdout
    assert "NATIVE" not in done.stdout + done.stderr


def _patch_reports(controller: str, **env: str) -> list[dict]:
    return reports(launch("horovod_patches.py", controller=controller, env=env).check())


@pytest.fixture(scope="module", params=CONTROLLERS)
def patch_reports(request) -> tuple[str, list[dict]]:
    """One launch of tests/workers/horovod_patches.py per controller, for the tests of
    patches 0002, 0003 and 0009."""
    return request.param, _patch_reports(request.param)


def test_0002_and_0003_idle_and_waiting_ranks_leave_the_cpu_alone(patch_reports):
    """Measured on the unpatched build: an idle rank's background thread used 0.17 s
    (Gloo) to 1.9 s (MPI) of CPU per 2 idle seconds, and a main thread waiting 2 s in
    synchronize for a late rank spun for 1.98 s of CPU; patched, both stay near 0."""
    for report in patch_reports[1]:
        assert report["idle_cpu_s"] < 0.1, report
        assert report["wait_cpu_s"] < 0.2, report


def test_0009_shutdown_leaves_no_connection_or_thread_behind(patch_reports):
    """Unpatched, under Gloo each of 2 ranks still had 3 TCP connections to the other and
    2 Gloo device threads after shutdown(): the global process set's contexts were never
    finalized, and were torn down by static destructors while the process exited (where a
    rank once aborted after a complete run). Patched, shutdown() releases them (under MPI
    there were none)."""
    for report in patch_reports[1]:
        assert report["connections_after_shutdown"] == 0, (patch_reports[0], report)
        assert report["native_threads_after_shutdown"] == 0, (patch_reports[0], report)


def test_0002_without_the_idle_wait_the_background_thread_cycles():
    """The control for the test above: HVDTRAIN_IDLE_WAIT_MS=0 restores Horovod's
    cycle every 1 ms while idle, which under MPI busy-polls for the other rank."""
    assert max(r["idle_cpu_s"] for r in _patch_reports("mpi", HVDTRAIN_IDLE_WAIT_MS="0")) > 0.3


def test_0004_the_launchers_build_check_is_answered_from_the_cache_of_this_build(tmp_path):
    """horovodrun asks whether Horovod was built with Gloo (or MPI) by importing a framework
    in a child process, seconds per launch. Patched, the first answer is kept per extension
    binary in $XDG_CACHE_HOME/horovod/build-checks.json and read back while the binary is
    unchanged: an answer planted there is returned without asking, and an entry for other
    binaries (another size or time) is ignored."""
    script = textwrap.dedent("""
        from horovod.common.util import gloo_built, _build_check_key
        print("answer", gloo_built(), flush=True)
        print("key", _build_check_key("tensorflow", "built with Gloo"), flush=True)
    """)

    def ask() -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
        return lines["answer"], lines["key"]

    cache = tmp_path / "horovod" / "build-checks.json"
    answer, key = ask()  # asks the extension, then remembers
    assert answer == "True"
    assert json.loads(cache.read_text()) == {key: True}
    cache.write_text(json.dumps({key: False}))  # a planted answer is what comes back
    assert ask()[0] == "False"
    path, size, mtime = key.rsplit(":", 2)
    stale = f"{path}:{int(size) + 1}:{mtime}"
    cache.write_text(json.dumps({stale: False}))  # other binaries: asked again
    assert ask()[0] == "True"
    assert json.loads(cache.read_text()) == {stale: False, key: True}


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_0005_tensorflow_join_waits_for_the_other_ranks_every_time(controller):
    """Unpatched, TensorFlow ran Horovod's join op once per process in eager mode: rank 1's
    second join returned at once while rank 0 still had a step to go (Horovod's trace log
    showed no join enqueued). Patched, rank 1 waits for rank 0's late step in every epoch,
    and that step sums rank 0's 1 alone."""
    rank0, rank1 = sorted(reports(launch("horovod_tf_join.py", controller=controller)
                                  .check()), key=lambda report: report["rank"])
    assert all(wait >= 0.4 for wait in rank1["joins_s"]), rank1
    assert len(rank1["joins_s"]) == 3
    assert rank0["counts"] == [2.0, 2.0, 1.0] * 3
    assert rank1["counts"] == [2.0, 2.0] * 3


def test_0006_elastic_workers_are_told_the_launchers_elastic_timeout(tmp_path):
    """Unpatched, ``--elastic-timeout`` stayed in the launcher: a worker could not know
    how long the driver waits after a reset (hvdtrain.elastic bounds its own wait by
    it). Patched, every elastic worker has it as HOROVOD_ELASTIC_TIMEOUT."""
    hosts = LocalHosts.create(tmp_path, ["host-a"])
    done = subprocess.run(
        [horovodrun_path(), "--gloo", "--network-interfaces", "lo", "-np", "1", "--min-np", "1",
         "--max-np", "1", "--elastic-timeout", "17",
         "--host-discovery-script", str(hosts.discovery_script), sys.executable, "-c",
         "import os; print('told', os.environ.get('HOROVOD_ELASTIC_TIMEOUT'))"],
        capture_output=True, text=True, timeout=120, env=hosts.environment())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "told 17" in done.stdout, done.stdout


# Against float64 sums: float16 holds the integer sums exactly, not their means.
LIMITS = {"float32": 1e-5, "float16": 0.02}


@pytest.mark.parametrize("np", [2, 3, pytest.param(5, marks=pytest.mark.scale),
                                pytest.param(8, marks=pytest.mark.scale)])
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_0007_0008_reduce_scatter_sums_each_ranks_rows(controller, np):
    """Patches 0007 (Gloo) and 0008 (MPI, for buffers of 1 MiB and more; below, Open
    MPI's own) make Horovod's reduce-scatter a ring that reads one tensor in place and
    writes its output directly (its speed: benchmarks/README.md, benchmark 7). On 2, 3, 5
    and 8 ranks (the ring's running sums take a path of their own from 3), each rank gets the
    sum and the mean over the ranks' tensors of its rows, as computed by every rank on its
    own: uneven splits, fewer rows than ranks, integers, float16 (under MPI Horovod's own
    sum operation), the scaled (copy-in) and fused paths, each also above 1 MiB."""
    done = launch("reducescatter.py", controller=controller, np=np).check()
    for report in reports(done):
        assert report["size"] == np
        for case, outcome in report["cases"].items():
            limit = LIMITS.get(case.split("_")[0], 1e-12)
            assert outcome["sum"] <= limit, (report["rank"], case, outcome)
            assert outcome.get("mean", 0.0) <= limit, (report["rank"], case, outcome)
        assert report["cases"]["fewer_rows_than_ranks"]["shape"][0] == (
            1 if report["rank"] < 2 else 0)


def test_0010_the_rendezvous_server_clears_a_scope_whichever_rank_finishes_first():
    """horovodrun's rendezvous server clears a scope of its host plan once every rank in it
    has said it finished (a DELETE). Two ranks on one host: rank 0 finishes with
    ``local_h`` and, alone in ``cross_0``, with that too, before rank 1 finishes with
    ``local_h``. Unpatched, the server then forgot rank 0's finish in ``local_h``, which
    was never cleared: the next init() in the job read the last round's addresses from it.
    Patched, every scope is empty at the end."""
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer

    plan = [SlotInfo(hostname="h", rank=rank, local_rank=rank, cross_rank=0, size=2,
                     local_size=2, cross_size=1) for rank in range(2)]
    server = RendezvousServer()
    port = server.start()
    try:
        server.init(plan)

        def request(method: str, scope: str, key: str) -> int:
            sent = urllib.request.Request(f"http://127.0.0.1:{port}/{scope}/{key}",
                                          data=b"address" if method == "PUT" else None,
                                          method=method)
            try:
                with urllib.request.urlopen(sent, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as error:
                return error.code

        scopes = {"global": (0, 1), "local_h": (0, 1), "cross_0": (0,), "cross_1": (1,)}
        for scope, ranks in scopes.items():
            for rank in ranks:
                assert request("PUT", scope, str(rank)) == 200
        for scope, rank in [("global", 0), ("global", 1), ("local_h", 0), ("cross_0", 0),
                            ("local_h", 1), ("cross_1", 1)]:
            request("DELETE", scope, str(rank))
        left = {(scope, rank) for scope, ranks in scopes.items() for rank in ranks
                if request("GET", scope, str(rank)) != 404}
        assert left == set(), f"stale rendezvous keys left for the next init(): {left}"
    finally:
        server.stop()


def test_0010_init_after_shutdown_survives_a_rank_slow_to_leave_each_rendezvous():
    """The same order in a real job: rank 1's rendezvous server answers pass through a
    proxy that holds each of its DELETEs for 50 ms (a slow link to the launcher, a busy
    host). Unpatched, all 6 jobs of 8 init/shutdown rounds tried aborted in init()
    (gloo::IoException: "connect [127.0.0.1]:PORT: Connection refused", or "Connect
    timeout" when both ranks waited for the other to connect)."""
    done = reports(launch("reinit.py", "8", "--slow-rendezvous-deletes", "50").check())
    assert sorted(report["rank"] for report in done) == [0, 1]
    for report in done:
        assert report["first_wrong"] is None, report


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_0011_bfloat16_collectives_equal_each_ranks_own_sum(controller, np):
    """Patch 0011 gives Horovod bfloat16 (MPI: a 2-byte type with its own sum, min, max
    and product; Gloo: a bfloat16 sum): allreduce (sum, average, pre- and post-scaled,
    min, max), reduce-scatter (patches 0007/0008's rings), allgather, broadcast, a grouped
    (fused) allreduce and fused asynchronous ones, on odd sizes, one element and above
    1 MiB. Each rank compares with the exact sum of every rank's tensor: the error stays
    within the documented bound, and on 2 ranks (one addition) the sum is this rank's
    own float32 sum rounded to bfloat16, bit for bit."""
    done = launch("bfloat16.py", controller=controller, np=np).check()
    for report in reports(done):
        assert report["size"] == np
        for case, outcome in report["cases"].items():
            assert outcome.get("ratio", 0.0) <= 1.0, (report["rank"], case, outcome)
            assert outcome.get("exact", True), (report["rank"], case, outcome)
        exact_sums = [c for c, o in report["cases"].items() if "exact" in o and "sum" in c]
        assert len(exact_sums) == (3 if np == 2 else 0), exact_sums
