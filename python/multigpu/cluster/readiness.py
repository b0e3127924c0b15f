"""How a worker tells `multigpu.launch` that it has joined its cluster.

The launcher gives every worker the same fresh directory in the environment
variable `READY_DIR_VARIABLE`. A worker whose cluster has formed writes the
file `worker-<task index>` there (written under another name, then renamed,
so a file that exists is complete); the launcher names the workers whose
file is missing when its start-up deadline passes.
"""

import os

READY_DIR_VARIABLE = "MULTIGPU_LAUNCH_READY_DIR"


def ready_file(ready_dir, index):
    """The file worker `index` writes in `ready_dir` once it has joined."""
    return os.path.join(ready_dir, f"worker-{index}")


def signal_ready(index):
    """Writes worker `index`'s ready file, when started by the launcher.

    Returns:
        Whether a file was written (False outside `multigpu.launch`).
    """
    ready_dir = os.environ.get(READY_DIR_VARIABLE)
    if not ready_dir:
        return False
    path = ready_file(ready_dir, index)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    return True


def not_ready(indices, ready_dir):
    """The worker indices, of `indices`, whose ready file is missing."""
    return [i for i in indices if not os.path.exists(ready_file(ready_dir, i))]
