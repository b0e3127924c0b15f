"""cluster_resolver: TF_CONFIG, then a Slurm job step, then one worker.

These tests set the variables a cluster manager sets and read what the
resolution finds, without forming a cluster (test_slurm.py and
test_distributed.py form real ones). A fake `nvidia-smi` stands in for a GPU
node.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import tensorflow as tf

import multigpu
from multigpu.cluster import resolver as cluster
from support.worker_scripts import fresh_python

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# `srun -n4 -N2`: two nodes, two tasks each; this process is task 3.
SLURM_STEP = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


@pytest.fixture
def environment(monkeypatch, tmp_path):
    """No cluster variables, and a PATH whose only program is what we add."""
    for name in list(os.environ):
        if name.startswith("SLURM_") or name in (
                "TF_CONFIG", "CUDA_VISIBLE_DEVICES", *cluster._OTHER_LAUNCHERS):
            monkeypatch.delenv(name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))

    def set_up(variables=(), gpus=None):
        for name, value in dict(variables).items():
            monkeypatch.setenv(name, value)
        if gpus is not None:
            fake = bin_dir / "nvidia-smi"
            fake.write_text("#!/bin/sh\n" + "".join(
                f"echo 'GPU {i}: Fake GPU (UUID: GPU-{i})'\n"
                for i in range(gpus)))
            fake.chmod(0o755)
        return bin_dir

    return set_up


def _no_warning(function):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return function()


def test_alone_without_any_cluster_variables(environment):
    environment()
    assert _no_warning(cluster.cluster_resolver) is None


def test_tf_config_comes_first(environment):
    config = {"cluster": {"worker": ["a:1", "b:2"]},
              "task": {"type": "worker", "index": 1}}
    environment({**SLURM_STEP, "TF_CONFIG": json.dumps(config)})
    resolver = cluster.cluster_resolver()
    assert isinstance(resolver,
                      tf.distribute.cluster_resolver.TFConfigClusterResolver)
    assert resolver.cluster_spec().as_dict() == {"worker": ["a:1", "b:2"]}
    assert resolver.task_id == 1


def test_a_slurm_step_on_cpu_nodes_gives_every_task_a_port(environment):
    environment(SLURM_STEP)
    resolver = _no_warning(cluster.cluster_resolver)
    base = cluster.slurm_port_base(4242, 0)
    assert resolver.cluster_spec().as_dict() == {"worker": [
        f"gpu07:{base}", f"gpu07:{base + 1}",
        f"gpu08:{base}", f"gpu08:{base + 1}"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    # No nvidia-smi: no GPU for the strategy, and CUDA left alone.
    assert resolver.num_accelerators() == {"GPU": 0}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_steps_get_ports_of_their_own():
    bases = {cluster.slurm_port_base(job, step)
             for job in range(100, 140) for step in range(3)}
    assert len(bases) == 120
    assert all(10000 <= b and b + 16 <= 32768 for b in bases)


def test_on_gpu_nodes_each_task_gets_its_share_of_the_gpus(environment):
    bin_dir = environment(SLURM_STEP, gpus=4)
    # TensorFlow reads CUDA_VISIBLE_DEVICES once, so resolve in a process
    # where it has not started: first with nvidia-smi listing 4 GPUs, then
    # with the node's GPUs listed in CUDA_VISIBLE_DEVICES.
    script = textwrap.dedent("""
        import json, os
        from multigpu.cluster import resolver as cluster
        found = []
        for node_gpus in (None, "4,5,6,7"):
            if node_gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = node_gpus
            resolver = cluster.cluster_resolver()
            found.append([os.environ.get("CUDA_VISIBLE_DEVICES"),
                          resolver.num_accelerators()])
        print(json.dumps(found))
    """)
    env = dict(os.environ, PATH=os.pathsep.join([str(bin_dir), os.path.dirname(
        sys.executable), "/usr/bin:/bin"]), PYTHONPATH=os.path.join(ROOT, "python"))
    result = subprocess.run(fresh_python(script), env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    # Task 3 is its node's second task: the node's GPUs 2 and 3.
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        ["2,3", {"GPU": 2}], ["6,7", {"GPU": 2}]]


def test_gpus_assigned_after_tensorflow_started_are_an_error(environment):
    environment(SLURM_STEP, gpus=4)
    tf.constant(1.0)  # TensorFlow runs in this process
    with pytest.raises(cluster.ClusterError,
                       match=r"CUDA_VISIBLE_DEVICES=2,3.*multigpu\."
                       r"multi_worker_strategy\(\) first"):
        cluster.cluster_resolver()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # left as it was


def test_gpus_slurm_bound_to_each_task_are_kept(environment):
    environment({**SLURM_STEP, "CUDA_VISIBLE_DEVICES": "5"}, gpus=8)
    resolver = cluster.cluster_resolver()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert resolver.num_accelerators() == {"GPU": 1}
    assert resolver.task_id == 3


def test_fewer_gpus_than_tasks_on_a_node_is_an_error(environment):
    environment(SLURM_STEP, gpus=1)
    with pytest.raises(cluster.ClusterError,
                       match=r"runs 2 tasks on a node with 1 GPU.*"
                       r"--ntasks-per-node=1"):
        cluster.cluster_resolver()


def test_a_step_with_missing_variables_names_them(environment):
    environment({k: v for k, v in SLURM_STEP.items()
                 if k != "SLURM_STEP_NODELIST"})
    with pytest.raises(cluster.ClusterError) as raised:
        cluster.cluster_resolver()
    message = str(raised.value)
    assert "SLURM_STEP_NODELIST is not set" in message
    assert "SLURM_STEP_NUM_TASKS=4" in message and "SLURM_PROCID=3" in message
    assert "srun" in message


def test_an_inconsistent_step_gets_tensorflows_reason_and_the_variables(
        environment):
    environment({**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "2"})
    with pytest.raises(cluster.ClusterError,
                       match=r"Requested 4 tasks but only 2 were assigned.*"
                       r"Found: .*SLURM_STEP_TASKS_PER_NODE=2"):
        cluster.cluster_resolver()


def test_a_slurm_job_without_srun_trains_alone_with_a_warning(environment):
    environment({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2",
                 "SLURM_PROCID": "0"})
    with pytest.warns(UserWarning, match=r"SLURM_NTASKS=2.*outside any job "
                      r"step.*trains alone.*srun"):
        assert cluster.cluster_resolver() is None


def test_a_one_task_step_in_a_one_task_job_is_quiet(environment):
    environment({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1",
                 "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"})
    assert _no_warning(cluster.cluster_resolver) is None


def test_another_launchers_processes_train_alone_with_a_warning(environment):
    environment({"OMPI_COMM_WORLD_SIZE": "4"})
    with pytest.warns(UserWarning, match=r"OMPI_COMM_WORLD_SIZE=4.*one of 4"
                      r".*multigpu.launch --workers 4 -- COMMAND"):
        assert cluster.cluster_resolver() is None


@pytest.mark.parametrize("raw", ['{"cluster": {}}', "not json",
                                 '{"cluster": {"worker": ["a:1"]}, '
                                 '"task": {"type": "worker", "index": 3}}'])
def test_a_malformed_tf_config_is_named(environment, raw):
    environment({"TF_CONFIG": raw})
    with pytest.raises(cluster.ClusterError, match="Invalid TF_CONFIG"):
        cluster.cluster_resolver()


def test_an_embedding_programs_environment_is_taken_over(environment):
    # (Set first so that the fixture restores them afterwards.)
    environment({"SLURM_PROCID": "1", "HOME_OF_TEST": "kept",
                 "TF_CONFIG": "", "CUDA_VISIBLE_DEVICES": ""})
    cluster.use_environment({"TF_CONFIG": "{}", "CUDA_VISIBLE_DEVICES": "0",
                             "HOME_OF_TEST": "changed", "OTHER": "x"})
    assert os.environ["TF_CONFIG"] == "{}"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert "SLURM_PROCID" not in os.environ  # gone from the embedding program
    assert os.environ["HOME_OF_TEST"] == "kept"  # not a cluster variable
    assert "OTHER" not in os.environ


@pytest.mark.parametrize("variables, chief", [
    ({}, True),
    (SLURM_STEP, False),
    ({**SLURM_STEP, "SLURM_PROCID": "0"}, True),
    # A job with several tasks run without srun is one worker: it writes.
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, True),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                               "task": {"type": "worker", "index": 1}})},
     False),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"], "chief": ["c:3"]},
                               "task": {"type": "worker", "index": 0}})},
     False),
    ({"TF_CONFIG": json.dumps({"cluster": {"chief": ["c:3"]},
                               "task": {"type": "chief", "index": 0}})},
     True),
])
def test_is_chief_follows_tf_config_then_the_slurm_step(environment, variables,
                                                        chief):
    environment(variables)
    assert cluster.is_chief() is chief


def test_multi_worker_strategy_rejects_a_malformed_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    with pytest.raises(ValueError, match="Invalid TF_CONFIG"):
        multigpu.multi_worker_strategy()
    monkeypatch.setenv("TF_CONFIG", "not json")
    with pytest.raises(ValueError, match="multigpu.launch"):
        multigpu.multi_worker_strategy()
