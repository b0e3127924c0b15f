"""Which cluster this process belongs to, from what the cluster manager set.

`cluster_resolver()` looks, in this order, at:

1. `TF_CONFIG`: set by Kubernetes (Kubeflow's TFJob), Vertex AI, or
   `python -m multigpu.launch` on one machine. TensorFlow's own
   `TFConfigClusterResolver` reads it.
2. A Slurm job step with more than one task (`srun -n2 python train.py`, or
   `srun` inside an `sbatch` script). TensorFlow's own `SlurmClusterResolver`
   reads the step's variables (`SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
   `SLURM_STEP_NODELIST`, `SLURM_STEP_TASKS_PER_NODE`); it is called here
   with what it cannot find out by itself on every node: the GPU count
   (it would run `nvidia-smi`, absent on CPU nodes), one GPU slot per task on
   CPU nodes (`gpus_per_task=0` makes it fail with "range() arg 3 must not be
   zero"), and a port range of the step's own, so that two steps on one node
   do not collide. On GPU nodes it gives every task its share of the node's
   GPUs through `CUDA_VISIBLE_DEVICES`.
3. Nothing: the process is a cluster of its own, with a warning when the
   environment looks like one task of a multi-task job that this process
   cannot join (a Slurm job with several tasks run without `srun`, or
   `mpirun`/`torchrun` variables).
"""

import json
import os
import shutil
import warnings

from multigpu.cluster.processes import PORTS_PER_STEP, slurm_port_base
from multigpu.messages import api, literal

TF_CONFIG = "TF_CONFIG"
# The variables TensorFlow's SlurmClusterResolver reads in a job step.
SLURM_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                        "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
# Variables of other launchers (Open MPI, MPICH/PMI, torchrun) that say this
# process is one of several.
_OTHER_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")


class ClusterError(ValueError):
    """The environment describes a cluster that cannot be joined as it is."""


def cluster_resolver():
    """The `tf.distribute` cluster resolver of this process, or None.

    Returns:
        A `TFConfigClusterResolver` when `TF_CONFIG` is set; a
        `SimpleClusterResolver` holding what TensorFlow's
        `SlurmClusterResolver` found when this process is a task of a Slurm
        job step with more than one task (its `num_accelerators()` is this
        task's GPU count, 0 on CPU nodes); otherwise None (one worker), after
        a warning when the environment looks like a multi-task job.

    Raises:
        ClusterError: when `TF_CONFIG` is malformed or the Slurm step's
            variables are incomplete or inconsistent; the message names the
            variables found and what is missing.

    Example:
    >>> resolver = cluster_resolver()   # in `srun -n2 python train.py`
    >>> resolver.cluster_spec().as_dict()
    {'worker': ['node1:12048', 'node1:12049']}
    """
    # TensorFlow's resolvers: imported here, so that the checkpoints, which
    # ask `is_chief` only, run on JAX without TensorFlow.
    import tensorflow as tf

    if os.environ.get(TF_CONFIG, "").strip():
        tf_config()
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if _slurm_step_tasks() > 1:
        return slurm_cluster_resolver()
    _warn_if_part_of_a_job()
    return None


def describes_cluster(name):
    """Whether the environment variable `name` is read to find the cluster.

    Example:
    >>> describes_cluster("SLURM_PROCID"), describes_cluster("HOME")
    (True, False)
    """
    return (name in (TF_CONFIG, "CUDA_VISIBLE_DEVICES", *_OTHER_LAUNCHERS)
            or name.startswith("SLURM_"))


def use_environment(environ):
    """Makes `os.environ` agree with `environ` on the cluster's variables.

    Python reads its process's environment once, when it starts. A program
    that embeds Python and changes the environment later (R through
    reticulate: `Sys.setenv(TF_CONFIG = ...)`) passes its whole environment
    here before resolving the cluster; the variables `describes_cluster`
    names are copied, or removed when `environ` lacks them.

    Args:
        environ: A mapping of names to values: the embedding program's
            environment.

    Example:
    >>> use_environment({"TF_CONFIG": config, "HOME": "/home/me"})
    """
    for name in set(os.environ) | set(environ):
        if not describes_cluster(name):
            continue
        if name in environ:
            os.environ[name] = str(environ[name])
        else:
            del os.environ[name]


def tf_config():
    """The parsed `TF_CONFIG`, or None when it is not set.

    Returns:
        The `TF_CONFIG` JSON as a dict, with at least `cluster.worker` (a list)
        and `task.index` (an int).

    Raises:
        ClusterError: when `TF_CONFIG` is not such JSON, or its task index is
            outside its list of workers.

    Example:
    >>> tf_config()["task"]
    {'type': 'worker', 'index': 0}
    """
    raw = os.environ.get(TF_CONFIG, "")
    if not raw.strip():
        return None
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ClusterError(
            f"Invalid TF_CONFIG environment variable: received {literal(raw)} "
            f"({type(error).__name__}: {error}). Expected JSON such as "
            '{"cluster": {"worker": ["host0:port", "host1:port"]}, '
            '"task": {"type": "worker", "index": 0}}; start local workers '
            "with `python -m multigpu.launch --workers N script`, or let "
            "the cluster manager set it."
        ) from None
    if task.get("type") == "worker" and not 0 <= index < len(workers):
        raise ClusterError(
            f"Invalid TF_CONFIG environment variable: task index {index} is "
            f"out of range for {len(workers)} worker(s) in {literal(raw)}."
        )
    return config


def is_chief():
    """Whether this process writes the checkpoints of its cluster.

    TensorFlow's rule for multi-worker training: the task of type "chief",
    or worker 0 of a cluster without a chief, writes; every other worker
    reads the same directory but writes nothing. The task comes from
    `TF_CONFIG`, else from a Slurm job step of more than one task (task 0,
    `SLURM_PROCID`, is the chief, as in `slurm_cluster_resolver`). A process
    alone, or with a `TF_CONFIG` it cannot read, writes.

    Returns:
        True or False.

    Example:
    >>> is_chief()   # task 1 of `srun -n2 python train.py`
    False
    """
    raw = os.environ.get(TF_CONFIG, "")
    if raw.strip():
        try:
            config = json.loads(raw)
            task = config.get("task", {})
            kind, index = task.get("type", "worker"), int(task.get("index", 0))
            has_chief = bool(config.get("cluster", {}).get("chief"))
        except (ValueError, AttributeError, TypeError):
            return True
        if kind == "chief":
            return True
        return kind == "worker" and index == 0 and not has_chief
    try:
        if _slurm_step_tasks() > 1:
            return _int_variable("SLURM_PROCID", 0) == 0
    except ClusterError:
        return True
    return True


def slurm_cluster_resolver():
    """What TensorFlow's `SlurmClusterResolver` finds in this job step.

    Returns:
        A `tf.distribute.cluster_resolver.SimpleClusterResolver` with the
        step's cluster (one worker per task, ports from `slurm_port_base`),
        this task's index, and this task's GPU count. On a GPU node without
        `CUDA_VISIBLE_DEVICES`, TensorFlow's resolver has set it to this
        task's share of the node's GPUs.

    Raises:
        ClusterError: when a step variable is missing or malformed, a node
            runs more tasks than the ports of one step, or a GPU node has
            fewer GPUs than tasks.
    """
    import tensorflow as tf

    from multigpu import tensorflow_internals

    found = _slurm_variables()
    missing = [name for name in SLURM_STEP_VARIABLES if name not in os.environ]
    if missing:
        raise ClusterError(
            f"This process looks like a task of a Slurm job step "
            f"(SLURM_STEP_NUM_TASKS={os.environ.get('SLURM_STEP_NUM_TASKS')}),"
            f" but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            f"not set, so its cluster cannot be resolved. Found: {found}. "
            "Start the script with `srun` (directly or inside an sbatch "
            "script), which sets them all, or set TF_CONFIG yourself."
        )
    try:
        tasks_per_node = dict(zip(
            tensorflow_internals.slurm_hostlist(os.environ["SLURM_STEP_NODELIST"]),
            tensorflow_internals.slurm_tasks_per_node(
                os.environ["SLURM_STEP_TASKS_PER_NODE"]),
        ))
        most = max(tasks_per_node.values())
        if most > PORTS_PER_STEP:
            raise ClusterError(
                f"A node of this Slurm step runs {most} tasks "
                f"({tasks_per_node}); multigpu gives each step "
                f"{PORTS_PER_STEP} ports per node. Run fewer tasks per node "
                "(`srun --ntasks-per-node=1`, or one per GPU)."
            )
        gpus, per_task, assign, task_gpus = _gpu_layout(most,
                                                        tasks_per_node)
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=slurm_port_base(_int_variable("SLURM_JOB_ID", 0),
                                      _int_variable("SLURM_STEP_ID", 0)),
            gpus_per_node=gpus, gpus_per_task=per_task, auto_set_gpu=assign,
        )
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        spec = resolver.cluster_spec()
    except (RuntimeError, ValueError) as error:
        if isinstance(error, ClusterError):
            raise
        raise ClusterError(
            f"TensorFlow's SlurmClusterResolver cannot resolve this job "
            f"step: {error}. Found: {found}."
        ) from error
    if resolver.task_type is None:
        raise ClusterError(
            f"TensorFlow's SlurmClusterResolver found no task for "
            f"SLURM_PROCID={os.environ['SLURM_PROCID']} in the step's "
            f"cluster {spec.as_dict()}. Found: {found}."
        )
    if assign:
        _keep_physical_ids(before)
        if os.environ.get("CUDA_VISIBLE_DEVICES") != before:
            _check_gpus_not_started(before)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=resolver.task_type, task_id=resolver.task_id,
        num_accelerators={"GPU": task_gpus},
        rpc_layer="grpc",
    )


def _slurm_variables():
    names = sorted(n for n in os.environ if n.startswith("SLURM_")
                   and ("STEP" in n or "TASK" in n or n in (
                       "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_NODELIST")))
    return ", ".join(f"{n}={os.environ[n]}" for n in names) or "none"


def _int_variable(name, default):
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        if value:
            raise ClusterError(
                f"Invalid {name} environment variable: received "
                f"{literal(value)}; expected a whole number. Found: "
                f"{_slurm_variables()}."
            ) from None
        return default


def _slurm_step_tasks():
    return _int_variable("SLURM_STEP_NUM_TASKS", 0)


def _visible_gpus():
    """GPUs `CUDA_VISIBLE_DEVICES` shows, or None when it is not set."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = [v for v in value.split(",") if v.strip()]
    # CUDA stops at the first invalid id; "-1" hides every GPU.
    return len(ids[:ids.index("-1")] if "-1" in ids else ids)


def _node_gpus():
    """GPUs on this node: `CUDA_VISIBLE_DEVICES`, else `nvidia-smi`, else 0."""
    visible = _visible_gpus()
    if visible is not None:
        return visible
    if shutil.which("nvidia-smi") is None:
        return 0
    from multigpu import tensorflow_internals

    try:
        return tensorflow_internals.nvidia_smi_gpu_count()
    except (RuntimeError, OSError):
        return 0


def _gpu_layout(most, tasks_per_node):
    """The resolver's (gpus_per_node, gpus_per_task, auto_set_gpu), and
    the number of GPUs this task trains on.

    CPU nodes: one pretend GPU slot per task, so that the resolver lists
    every task, and no `CUDA_VISIBLE_DEVICES`. GPU nodes: the node's GPUs
    shared evenly, each task's written to `CUDA_VISIBLE_DEVICES`, unless
    `CUDA_VISIBLE_DEVICES` already gives this task fewer GPUs than the
    node has tasks (Slurm's `--gpus-per-task`/`--gpu-bind` did the sharing).
    """
    gpus = _node_gpus()
    if gpus == 0:
        return most, 1, False, 0
    visible = _visible_gpus()
    if visible is not None and visible < most:
        return most * visible, visible, False, visible
    if gpus < most:
        raise ClusterError(
            f"This Slurm step runs {most} tasks on a node with {gpus} GPU(s) "
            f"({tasks_per_node}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')}): every task needs at "
            f"least one GPU. Start at most {gpus} task(s) per node "
            f"(`srun --ntasks-per-node={gpus}`), or give each task its GPUs "
            "with `srun --gpus-per-task=1`."
        )
    return gpus, gpus // most, True, gpus // most


def _keep_physical_ids(before):
    """Maps the resolver's GPU indices through `before`, the node's list.

    TensorFlow's resolver numbers the node's GPUs 0, 1, ...; when
    `CUDA_VISIBLE_DEVICES` listed the node's GPUs (say "4,5,6,7"), index 2
    means GPU 6.
    """
    if not before:
        return
    node = [v.strip() for v in before.split(",") if v.strip()]
    assigned = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(
        node[int(i)] for i in assigned.split(",") if i)


def _check_gpus_not_started(before):
    """Raises, restoring `CUDA_VISIBLE_DEVICES`, if TensorFlow has started."""
    from multigpu import tensorflow_internals

    # CUDA reads CUDA_VISIBLE_DEVICES once, when TensorFlow first starts it.
    if tensorflow_internals.cuda_may_have_started():
        assigned = os.environ.get("CUDA_VISIBLE_DEVICES")
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
        raise ClusterError(
            "TensorFlow started before this Slurm task could be given its "
            f"GPUs (CUDA_VISIBLE_DEVICES={assigned}), so every task would "
            f"use the same GPUs. Call {api('multi_worker_strategy')} first in "
            "the script, before anything else runs TensorFlow (in R, before "
            "library(keras3): keras3 starts TensorFlow when Keras loads)."
        )


def _warn_if_part_of_a_job():
    slurm_tasks = _int_variable("SLURM_NTASKS", 0)
    if slurm_tasks > 1:
        step = os.environ.get("SLURM_STEP_NUM_TASKS")
        where = ("in a job step of 1 task" if step else
                 "outside any job step (the batch script itself)")
        warnings.warn(
            f"This process runs in Slurm job {os.environ.get('SLURM_JOB_ID')}"
            f" of {slurm_tasks} tasks (SLURM_NTASKS={slurm_tasks}) but "
            f"{where}, so it trains alone as one worker. Start the training "
            "with `srun python train.py` (or `srun Rscript train.R`) inside "
            "the job so that every task joins the cluster.",
            stacklevel=3,
        )
        return
    for name in _OTHER_LAUNCHERS:
        size = _int_variable(name, 0)
        if size > 1:
            warnings.warn(
                f"{name}={size} says this process is one of {size} started "
                "by another launcher, but multigpu finds its cluster only "
                "from TF_CONFIG or a Slurm job step, so it trains alone as "
                "one worker. Set TF_CONFIG for every process, start them "
                "with `srun`, or with `python -m multigpu.launch --workers "
                f"{size} -- COMMAND` on one machine.",
                stacklevel=3,
            )
            return
