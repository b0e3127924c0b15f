"""The processes of one training job, read from what started them.

Backend-neutral: it reads only the environment. A job is several processes
when

1. `TF_CONFIG` lists more than one task: set by `python -m multigpu.launch`
   on one machine, and on Kubernetes by Kubeflow's TFJob or Vertex AI. The
   tasks are numbered as TensorFlow's collectives number them: the chief
   (if any) first, then the workers in order.
2. This process is a task of a Slurm job step with more than one task
   (`srun -n 2 python train.py`, or `srun` inside an `sbatch` script). Task
   0 of the step, on the step's first node, coordinates, on a port chosen
   from the job and step ids (`slurm_port_base`) so that two steps on one
   node do not collide.

Otherwise the process trains alone. `ProcessGroup.coordinator` is the
address process 0 listens on for the others to join; the TensorFlow
engines read the same variables through `multigpu.cluster.resolver`, the
JAX engine through `multigpu.engines.jax.processes`.
"""

import dataclasses
import json
import os
import re

TF_CONFIG = "TF_CONFIG"
# Ports of a Slurm step: its tasks on one node listen on consecutive ports
# from a base chosen by job and step id, in [10000, 32400), below Linux's
# ephemeral ports; one step's slot holds up to `PORTS_PER_STEP` tasks per node.
_PORT_FLOOR = 10000
PORTS_PER_STEP = 16
_PORT_SLOTS = 1400


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """The processes of one job, as this process sees them.

    Attributes:
        coordinator: `"host:port"` where process 0 waits for the others.
        count: How many processes the job has, >= 2.
        index: This process's number, in `[0, count)`.
        source: What described the job: `"TF_CONFIG"` or `"Slurm"`.
    """

    coordinator: str
    count: int
    index: int
    source: str


class ProcessGroupError(ValueError):
    """The environment describes a job of several processes that is malformed."""


def slurm_port_base(job_id, step_id):
    """The first port of a Slurm job step's tasks on each node.

    Every task of the step computes the same value; steps whose job or step
    ids differ get different ranges (until the ids wrap after 1400 steps).

    Args:
        job_id: `SLURM_JOB_ID`, an int.
        step_id: `SLURM_STEP_ID`, an int.

    Returns:
        An int in [10000, 32400), a multiple of 16.

    Example:
    >>> slurm_port_base(7, 0)
    10784
    """
    slot = (job_id * 7 + step_id) % _PORT_SLOTS
    return _PORT_FLOOR + slot * PORTS_PER_STEP


def first_host(nodelist):
    """The first host of a Slurm node list (`SLURM_STEP_NODELIST`).

    Args:
        nodelist: Slurm's compact list, e.g. `"gpu[07-09,12],login1"`.

    Returns:
        The first host's name, e.g. `"gpu07"`.

    Raises:
        ProcessGroupError: for an empty or malformed list.

    Example:
    >>> first_host("gpu[07-09,12],login1")
    'gpu07'
    """
    match = re.match(r"\s*([^,\[\s]+)(?:\[([^\]\-,]+)[^\]]*\])?", nodelist or "")
    if not match:
        raise ProcessGroupError(
            f"Invalid SLURM_STEP_NODELIST: received {nodelist!r}; expected "
            "Slurm's node list, such as 'node[01-04]'."
        )
    return match.group(1) + (match.group(2) or "")


def process_group(environ=None):
    """The job this process belongs to, or None when it trains alone.

    Args:
        environ: The environment to read; `os.environ` when None.

    Returns:
        A `ProcessGroup` when `TF_CONFIG` lists more than one task or this
        process is a task of a Slurm job step with more than one task; None
        otherwise.

    Raises:
        ProcessGroupError: when `TF_CONFIG` or the step's variables are
            malformed; the message names the variable and its value.

    Example:
    >>> process_group({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
    ...                "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1",
    ...                "SLURM_STEP_NODELIST": "n[1-2]"})
    ProcessGroup(coordinator='n1:10784', count=2, index=1, source='Slurm')
    """
    environ = os.environ if environ is None else environ
    if environ.get(TF_CONFIG, "").strip():
        return _from_tf_config(environ[TF_CONFIG])
    if _int(environ, "SLURM_STEP_NUM_TASKS", 1) > 1:
        return _from_slurm_step(environ)
    return None


def _int(environ, name, default):
    raw = environ.get(name, "")
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ProcessGroupError(
            f"Invalid {name}: received {raw!r}; expected an integer."
        ) from None


def _from_tf_config(raw):
    try:
        config = json.loads(raw)
        cluster = config["cluster"]
        tasks = [(kind, i, address)
                 for kind in ("chief", "worker")
                 for i, address in enumerate(cluster.get(kind, []))]
        task = config.get("task", {})
        me = (task.get("type", "worker"), int(task.get("index", 0)))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ProcessGroupError(
            f"Invalid TF_CONFIG: received {raw!r} ({error}); expected JSON "
            'such as {"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        ) from None
    if len(tasks) < 2:
        return None
    numbers = [(kind, i) for kind, i, _ in tasks]
    if me not in numbers:
        raise ProcessGroupError(
            f"Invalid TF_CONFIG: its task {me[0]} {me[1]} is not in its "
            f"cluster {cluster}; set task.type and task.index to one of its "
            "tasks."
        )
    return ProcessGroup(tasks[0][2], len(tasks), numbers.index(me), TF_CONFIG)


def _from_slurm_step(environ):
    count = _int(environ, "SLURM_STEP_NUM_TASKS", 1)
    missing = [name for name in ("SLURM_PROCID", "SLURM_STEP_NODELIST",
                                 "SLURM_JOB_ID", "SLURM_STEP_ID")
               if not environ.get(name, "").strip()]
    if missing:
        raise ProcessGroupError(
            f"This process looks like a task of a Slurm job step of {count} "
            f"tasks, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. Start the script "
            "with `srun` (directly or inside an sbatch script), which sets them."
        )
    index = _int(environ, "SLURM_PROCID", 0)
    if not 0 <= index < count:
        raise ProcessGroupError(
            f"Invalid SLURM_PROCID: received {index} in a step of {count} tasks."
        )
    port = slurm_port_base(_int(environ, "SLURM_JOB_ID", 0),
                           _int(environ, "SLURM_STEP_ID", 0))
    host = first_host(environ["SLURM_STEP_NODELIST"])
    return ProcessGroup(f"{host}:{port}", count, index, "Slurm")
