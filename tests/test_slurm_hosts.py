"""hvdtrain.jobs.slurm and ``hvdtrain hosts`` in one process: Slurm's task counts and node
lists as horovodrun -H's host list. Inside a real allocation: tests/test_slurm.py."""

import pytest

from hvdtrain.jobs import cli, slurm


@pytest.mark.parametrize(("text", "counts"), [
    ("2", [2]), ("4(x2),2", [4, 4, 2]), ("1,3(x3)", [1, 3, 3, 3]), (" 8 ", [8]),
])
def test_slurm_task_counts_expand(text, counts):
    assert slurm.tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "4(x)", "2(3)", "1,,2"])
def test_a_task_count_list_that_is_not_slurms_is_refused(text):
    with pytest.raises(slurm.NotInAllocation, match="is not a Slurm task count list"):
        slurm.tasks_per_node(text)


def test_the_host_list_pairs_nodes_with_their_task_counts():
    assert slurm.host_list(["a", "b", "c"], "4(x2),1") == "a:4,b:4,c:1"
    with pytest.raises(slurm.NotInAllocation, match=r"gives 3 nodes but SLURM_JOB_NODELIST "
                                                     r"names 2: \['a', 'b'\]"):
        slurm.host_list(["a", "b"], "4(x2),1")


def test_the_allocation_is_read_from_slurms_variables():
    environ = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    expanded = {"node[01-02]": ["node01", "node02"]}
    assert slurm.allocation_hosts(environ, expand=expanded.__getitem__) == "node01:2,node02:2"


def test_hosts_outside_an_allocation_says_where_to_run_it(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_TASKS_PER_NODE", raising=False)
    assert cli.main(["hosts"]) == 2
    assert capsys.readouterr().err == (
        "hvdtrain hosts: error: not inside a Slurm allocation (SLURM_JOB_NODELIST and "
        "SLURM_TASKS_PER_NODE unset): run this in an sbatch script or an salloc shell, with "
        "--ntasks (-n) given\n")


def test_hosts_prints_one_line_per_host_for_a_discovery_script(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "a,b")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1(x2)")
    monkeypatch.setattr(slurm, "expand_nodelist", lambda nodelist: nodelist.split(","))
    assert cli.main(["hosts", "--lines"]) == 0
    assert capsys.readouterr().out == "a:1\nb:1\n"
