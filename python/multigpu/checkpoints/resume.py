"""The resume state: what a restarted `fit` needs to continue exactly.

A backup directory holds, per save, a weights file (weights and optimizer
state) and a state file (the epoch, the batches trained in it, the
random-generator states), committed together by atomically replacing
`training_metadata.json`; the previous save is kept as a fallback.
`ResumePosition` and `skipping_train_function` let a resumed epoch draw the
batches trained before the interruption without training on them.
"""

import json
import os
import re
import warnings

import numpy as np

from multigpu import internals
from multigpu.checkpoints import atomic
from multigpu.messages import setting

METADATA_NAME = "training_metadata.json"
STATE_PATTERN = re.compile(r"^state-(\d+)\.json$")
WEIGHTS_PATTERN = re.compile(r"^weights-(\d+)\.weights\.h5$")


class ResumePosition:
    """Where a restarted `fit` resumes, shared by the checkpoint callbacks.

    The backup callback sets `skip` to the batches of the resumed epoch
    that were trained before the interruption; the model's train function
    then draws those batches without training on them (so the data is at
    the same place as in an uninterrupted run), and `skipped` tells the
    callbacks that the batch just ended was such a batch.

    Example:
    >>> position = ResumePosition()
    >>> position.skip, position.skipped
    (0, False)
    """

    def __init__(self):
        self.skip = 0
        self.skipped = False


def skipping_train_function(train_function, model, position):
    """Wraps a train function: its first `position.skip` batches only draw.

    Keras's `fit` (and `fit_distributed`) call `model.train_function` once
    per step with the data iterator (on JAX, `train_function(state,
    iterator)`); the wrapper draws the step's batches and returns no logs
    (on JAX, no logs and the state it was given) while `position.skip` is
    positive. The backup callback makes it the `"resume"` link of the
    train function (`multigpu.step.train_function`).

    Args:
        train_function: The train function to wrap.
        model: The model (its `steps_per_execution` batches make a step).
        position: The `ResumePosition` to count down.

    Returns:
        A function of the iterator (on JAX, of the state and the iterator).

    Example:
    >>> skipping = skipping_train_function(train, model, position)
    """

    def train(*state_and_iterator):
        if position.skip > 0:
            for _ in range(max(int(getattr(model, "steps_per_execution", 1)
                                   or 1), 1)):
                next(state_and_iterator[-1])
                position.skip -= 1
            position.skipped = True
            if len(state_and_iterator) == 2:
                return {}, state_and_iterator[0]
            return {}
        position.skipped = False
        return train_function(*state_and_iterator)

    return train


def random_state_variables(model):
    """The seed-generator states a training step draws from.

    Keras saves a model's weights and optimizer, not the states of its
    `SeedGenerator`s (dropout, noise layers) nor the global one that
    unseeded `keras.random` calls use; a resumed run restores them so its
    random draws continue where the interrupted run's stopped.

    Args:
        model: A built `keras.Model`.

    Returns:
        A dict `{name: variable}`.
    """
    states = {v.path: v for v in model.non_trainable_variables
              if v.path.endswith("seed_generator_state")}
    generator = internals.global_seed_generator()
    if generator is not None:
        states["global_seed_generator"] = generator.state
    return states


def restore_random_state(model, saved):
    """Assigns the saved seed-generator states (`{name: list}`) to `model`'s."""
    variables = random_state_variables(model)
    for name, value in saved.items():
        if name in variables:
            variables[name].assign(np.asarray(value, "uint32").astype(
                variables[name].dtype))


def state_paths(backup_dir):
    """Candidate committed states, newest first: the metadata, then `state-N.json`."""
    paths = [os.path.join(backup_dir, METADATA_NAME)]
    if os.path.isdir(backup_dir):
        named = [n for n in os.listdir(backup_dir) if STATE_PATTERN.match(n)]
        named.sort(key=lambda n: int(STATE_PATTERN.match(n)[1]), reverse=True)
        paths += [os.path.join(backup_dir, n) for n in named]
    return [p for p in paths if os.path.exists(p)]


def read_state(path):
    """The state saved in `path` (a dict); raises what reading raises."""
    with open(path) as f:
        return json.load(f)


def newest_version(backup_dir):
    """The highest `state-N.json` number in `backup_dir` (0 if none)."""
    if not os.path.isdir(backup_dir):
        return 0
    versions = [int(m[1]) for m in map(STATE_PATTERN.match,
                                        os.listdir(backup_dir)) if m]
    return max(versions, default=0)


def write_state(model, backup_dir, state):
    """Saves `model`'s weights and `state`, committed by the metadata's rename.

    Args:
        model: The model being trained.
        backup_dir: The backup directory (created if missing).
        state: A dict with `version` (an int) and the position; its
            `weights` and `random` entries are filled in here.

    Raises:
        OSError: from `atomic.write_error` when a write fails; the
            committed state is intact.
    """
    os.makedirs(backup_dir, exist_ok=True)
    version = state["version"]
    name = f"weights-{version}.weights.h5"
    state = {**state, "weights": name, "random": {
        k: np.asarray(v.numpy()).tolist()
        for k, v in random_state_variables(model).items()}}
    weights = os.path.join(backup_dir, name)
    state_path = os.path.join(backup_dir, f"state-{version}.json")
    written = []
    try:
        atomic.write_atomically(weights, lambda temp: atomic.save_weights_file(
            model, temp), written)
        atomic.write_atomically(state_path, lambda temp: atomic.dump_json(
            state, temp), written)
        atomic.write_atomically(os.path.join(backup_dir, METADATA_NAME),
                                lambda temp: atomic.dump_json(state, temp),
                                written)
    except OSError as error:
        raise atomic.write_error(error, backup_dir) from error
    prune_states(backup_dir, keep=(version, version - 1))


def prune_states(backup_dir, keep):
    """Deletes the weights and state files whose version is not in `keep`."""
    for name in os.listdir(backup_dir):
        match = STATE_PATTERN.match(name) or WEIGHTS_PATTERN.match(name)
        if match and int(match[1]) not in keep:
            atomic.remove_quietly(os.path.join(backup_dir, name))


def warn_if_steps_per_execution(model, save_freq):
    """Warns when a mid-epoch resume cannot be step-exact."""
    steps = getattr(model, "steps_per_execution", 1) or 1
    if save_freq == "epoch" or int(steps) <= 1:
        return
    warnings.warn(
        f"checkpoint_callbacks({setting('save_freq', save_freq)}) with a "
        f"model compiled with {setting('steps_per_execution', int(steps))}: "
        "callbacks see one batch end per execution of "
        f"{int(steps)} batches, so checkpoints are taken every {save_freq} "
        "executions and a run resumed in the middle of an epoch does not "
        "continue at the exact batch. Compile with "
        f"{setting('steps_per_execution', 1)} for step-exact resumes, or "
        f"checkpoint with {setting('save_freq', 'epoch')} (a resume then "
        "starts at the interrupted epoch's first batch).",
        UserWarning, stacklevel=3,
    )
