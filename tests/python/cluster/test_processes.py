"""process_group: which job of several processes the environment describes.

Read by the JAX engine to join the other processes (`jax.distributed`);
the TensorFlow resolver reads the same variables (test_cluster.py). These
tests pass environments and read the result; test_jax_processes.py and
test_slurm.py join real processes.
"""

import json

import pytest

from multigpu.cluster.processes import (
    ProcessGroup,
    ProcessGroupError,
    first_host,
    process_group,
    slurm_port_base,
)

SLURM_STEP = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_PROCID": "2", "SLURM_STEP_NODELIST": "gpu[07-08]",
}


def _tf_config(cluster, kind, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                     "task": {"type": kind, "index": index}})}


def test_a_process_alone_has_no_group():
    assert process_group({}) is None
    assert process_group({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    assert process_group(_tf_config({"worker": ["h:1"]}, "worker", 0)) is None


def test_the_launchers_workers_are_numbered_as_in_tf_config():
    workers = ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]
    for index in range(3):
        assert process_group(_tf_config({"worker": workers}, "worker", index)) == (
            ProcessGroup("127.0.0.1:5000", 3, index, "TF_CONFIG"))


def test_a_chief_is_process_0_and_coordinates():
    cluster = {"chief": ["c:7"], "worker": ["w0:7", "w1:7"]}
    assert process_group(_tf_config(cluster, "chief", 0)).index == 0
    group = process_group(_tf_config(cluster, "worker", 1))
    assert (group.coordinator, group.count, group.index) == ("c:7", 3, 2)


def test_tf_config_wins_over_a_slurm_step():
    group = process_group({**SLURM_STEP, **_tf_config({"worker": ["a:1", "b:2"]},
                                                      "worker", 1)})
    assert group.source == "TF_CONFIG"


def test_a_slurm_step_coordinates_on_its_first_node_and_its_own_port():
    group = process_group(SLURM_STEP)
    assert group == ProcessGroup(f"gpu07:{slurm_port_base(4242, 3)}", 4, 2, "Slurm")
    other_step = process_group({**SLURM_STEP, "SLURM_STEP_ID": "4"})
    assert other_step.coordinator != group.coordinator


@pytest.mark.parametrize("nodelist, host", [
    ("node001", "node001"), ("node001,host2", "node001"),
    ("gpu[07-09,12],login1", "gpu07"), ("gpu[3,5]", "gpu3"), ("a-b[10-11]", "a-b10"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("environ, says", [
    ({"TF_CONFIG": "{not json"}, "Invalid TF_CONFIG: received '{not json'"),
    (_tf_config({"worker": ["a:1", "b:2"]}, "worker", 5),
     "its task worker 5 is not in its cluster"),
    ({**SLURM_STEP, "SLURM_PROCID": "9"}, "Invalid SLURM_PROCID: received 9 in a step of 4"),
    ({**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "two"}, "Invalid SLURM_STEP_NUM_TASKS: received 'two'"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"},
     "SLURM_STEP_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID are not set"),
])
def test_a_malformed_job_is_refused_naming_the_variable(environ, says):
    with pytest.raises(ProcessGroupError, match=None) as raised:
        process_group(environ)
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)
