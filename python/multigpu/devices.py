"""Device discovery, simulated devices and the one resolver of device arguments.

Every public function that takes a device argument (`gpus=` of
`multi_gpu_model`, `devices=` of the strategies) resolves it here, so the same
value means the same devices everywhere.
"""

import dataclasses
import os
import re
import warnings

import numpy as np

from multigpu import runtime
from multigpu.arguments import check_int, is_int
from multigpu.messages import api, literal, literals, setting

# Decided in `runtime`, kept readable here: more logical CPU devices than
# this many per core only slow a simulation; the cores this process may use.
from multigpu.runtime import OVERSUBSCRIPTION, usable_cores  # noqa: F401

# The host's CPU: where Keras hands batches over, and where the replicate
# engine slices batches and merges outputs unless told otherwise.
HOST_DEVICE = "/device:CPU:0"


@dataclasses.dataclass
class DevicesState:
    """What this module keeps for the process.

    Attributes:
        warned: Keys of the warnings given once per process.
    """

    warned: set = dataclasses.field(default_factory=set)

    def reset(self):
        """Forgets the warnings given (for tests), as a fresh import would."""
        self.warned.clear()


STATE = DevicesState()

_DEVICE_NAME = re.compile(
    r"^(?:/job:localhost)?(?:/replica:0)?(?:/task:0)?"
    r"/?(?:device:)?(?P<type>cpu|gpu|tpu):(?P<index>\d+)$",
    re.IGNORECASE,
)
def _expected():
    return (f"expected {literal(None)} (every GPU, or every logical CPU device when there is no "
    f"GPU), an int >= 2 (that many devices), a list of >= 2 distinct GPU ids "
    f"such as {literal([0, 1])}, or a list of >= 2 distinct device names such as "
    f"{literal(['/gpu:0', '/gpu:1'])} or {literal(['/cpu:0', '/cpu:1'])}")


# The warnings point at the user's line: Python 3.12 skips this package's
# frames itself; before it, they point at the caller of `_warn_once`'s
# caller.
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _warn_once(key, message):
    if key not in STATE.warned:
        STATE.warned.add(key)
        try:
            warnings.warn(message, UserWarning,
                          skip_file_prefixes=(_PACKAGE,))
        except TypeError:  # Python < 3.12
            warnings.warn(message, UserWarning, stacklevel=3)


def available_devices():
    """Lists the logical devices the Keras backend can place work on.

    TensorFlow's logical devices, or on the JAX backend JAX's devices, named
    alike (`"/device:CPU:1"` is JAX's second CPU device).

    Returns:
        A dict with keys `"GPU"` and `"CPU"`, each a list of canonical device
        names such as `"/device:GPU:0"`.

    Example:
    >>> multigpu.available_devices()
    {'GPU': [], 'CPU': ['/device:CPU:0', '/device:CPU:1']}
    """
    listed = runtime.of_backend().logical_devices
    return {kind: listed(kind) for kind in ("GPU", "CPU")}


def describe_machine(devices=None):
    """One line saying which devices this machine has, for error messages."""
    devices = devices or available_devices()
    gpus = ", ".join(devices["GPU"]) or "none"
    cpus = ", ".join(devices["CPU"]) or "none"
    return f"This machine has GPUs: {gpus}; CPU devices: {cpus}."


def canonical_device_name(name):
    """Normalises a device name such as `"/gpu:1"` to `"/device:GPU:1"`.

    Args:
        name: A device name in any spelling TensorFlow accepts for a local
            device: `"/gpu:1"`, `"gpu:1"`, `"/device:CPU:3"` or
            `"/job:localhost/replica:0/task:0/device:GPU:0"`.

    Returns:
        The canonical name, `"/device:TYPE:INDEX"`.

    Raises:
        ValueError: if `name` is not a local device name.
    """
    match = _DEVICE_NAME.match(name.strip()) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"Device name {literal(name)} is not a local device name; expected a name "
            f"such as {literals(['/gpu:0', '/cpu:1', '/device:GPU:2'])}."
        )
    return f"/device:{match['type'].upper()}:{int(match['index'])}"


def short_device_name(name):
    """The `"/device:TYPE:N"` part of a full device name.

    Example:
    >>> short_device_name("/job:localhost/replica:0/task:0/device:CPU:1")
    '/device:CPU:1'
    """
    return "/device:" + name.rsplit("/device:", 1)[-1]


def _invalid(gpus, problem, machine, fix=""):
    fix = f" {fix}" if fix else ""
    return ValueError(
        f"Invalid `gpus`/`devices` argument: received {literal(gpus)}. {problem} "
        f"{_expected()[0].upper()}{_expected()[1:]}. {describe_machine(machine)}"
        f"{fix}"
    )


def _default_devices(machine):
    if machine["GPU"]:
        chosen = machine["GPU"]
    elif len(machine["CPU"]) >= 2:
        chosen = machine["CPU"]
        _warn_once(
            "cpu-fallback",
            f"No GPU found: using the {len(chosen)} logical CPU devices "
            f"{literal(chosen)}.",
        )
    else:
        chosen = machine["CPU"][:1]
    if len(chosen) == 1:
        _warn_once(
            f"single-{chosen[0]}",
            f"Only one device ({chosen[0]}) is available: the model runs on it "
            f"without data parallelism. Call {api('virtual_devices', 'n')} at "
            "start-up to simulate n devices.",
        )
    return list(chosen)


def _devices_by_count(count, gpus, machine):
    if count < 2:
        raise _invalid(
            gpus, f"A device count must be >= 2, not {count}.", machine,
            f"For a single device use the model itself, or {setting('gpus', None)} to "
            "run on whatever is available.",
        )
    pool = machine["GPU"] or machine["CPU"]
    if count > len(pool):
        kind = "GPU" if machine["GPU"] else "logical CPU device"
        raise _invalid(
            gpus, f"{count} devices were asked for but only {len(pool)} "
            f"{kind}(s) exist.", machine,
            f"Ask for fewer, or call {api('virtual_devices', 'n')} before "
            "TensorFlow starts to simulate more CPU devices.",
        )
    if not machine["GPU"]:
        _warn_once(
            "cpu-fallback",
            f"No GPU found: using {count} logical CPU devices.",
        )
    return pool[:count]


def _devices_by_ids(ids, gpus, machine):
    gpu_names = machine["GPU"]
    if not gpu_names:
        raise _invalid(
            gpus, "GPU ids were given but this machine has no GPU.", machine,
            f"Use a count ({setting('gpus', 2)}) or CPU device names "
            f"({setting('gpus', ['/cpu:0', '/cpu:1'])}) instead.",
        )
    bad = [i for i in ids if not 0 <= int(i) < len(gpu_names)]
    if bad:
        raise _invalid(
            gpus, f"GPU id(s) {literal(bad)} are out of range 0..{len(gpu_names) - 1}.",
            machine,
        )
    return [gpu_names[int(i)] for i in ids]


def _devices_by_names(names, gpus, machine):
    try:
        canonical = [canonical_device_name(n) for n in names]
    except ValueError as error:
        raise _invalid(gpus, str(error), machine) from None
    known = set(machine["GPU"]) | set(machine["CPU"])
    unknown = [n for n, c in zip(names, canonical) if c not in known]
    if unknown:
        raise _invalid(gpus, f"Unknown device(s) {literal(unknown)}.", machine)
    return canonical


def _whole_number_string(value):
    """The int a string such as `"2"` spells, or None."""
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        return int(value)
    return None


def _check_not_numbers_in_disguise(gpus, machine):
    """Refuses numbers passed as strings, floats or bools, saying the fix.

    `"2"` (an R `factor(2)` arrives so too) and `2.0` look like a device
    count, `["0", "1"]` like GPU ids, `True` like "yes, use GPUs"; none of
    them is a device name or an int, so each gets its own fix.
    """
    if isinstance(gpus, (bool, np.bool_)):
        raise _invalid(
            gpus, f"{literal(gpus)} is neither a device count nor a device set.",
            machine, f"For every device pass {setting('gpus', None)}.",
        )
    if isinstance(gpus, (float, np.floating)) and float(gpus).is_integer():
        raise _invalid(
            gpus, f"A device count is an int, not the float {literal(gpus)}.",
            machine, f"Pass {setting('gpus', int(gpus))}.",
        )
    entries = [gpus] if isinstance(gpus, str) else gpus
    if not isinstance(entries, (list, tuple)) or not entries:
        return
    numbers = [_whole_number_string(g) for g in entries]
    if any(n is None for n in numbers):
        return
    if len(numbers) == 1:
        raise _invalid(
            gpus, f"{literal(entries[0])} is a string, neither a device count "
            "nor a device name.", machine,
            f"For {numbers[0]} devices pass the number: "
            f"{setting('gpus', numbers[0])}.",
        )
    raise _invalid(
        gpus, f"{literal(list(entries))} are strings, not GPU ids.", machine,
        f"Pass GPU ids as numbers: {setting('gpus', numbers)}.",
    )


def _another_device(name, machine):
    """A device of the machine other than `name`, for an example."""
    others = [d for d in machine["GPU"] + machine["CPU"] if d != name]
    return others[0] if others else "/cpu:1"


def resolve_devices(gpus=None):
    """Resolves a `gpus`/`devices` argument to canonical device names.

    This is the single resolver behind `multi_gpu_model(gpus=...)`,
    `mirrored_strategy(devices=...)` and `model_parallel(devices=...)`.

    Args:
        gpus: `None` for every GPU (on a machine without GPUs: every logical
            CPU device, with a one-time warning; on a single-device machine:
            that device, with a warning); an int >= 2 for that many devices;
            a list of >= 2 GPU ids; or a list of >= 2 device names such as
            `["/gpu:0", "/cpu:1"]`.

    Returns:
        A list of canonical device names such as `["/device:GPU:0", ...]`.

    Raises:
        ValueError: if `gpus` is not one of the above or names devices that
            this machine does not have. The message names the value
            received, what is expected and what this machine has.

    Example:
    >>> multigpu.resolve_devices(2)
    ['/device:CPU:0', '/device:CPU:1']
    """
    machine = available_devices()
    if gpus is None:
        return _default_devices(machine)
    if is_int(gpus):
        return _devices_by_count(int(gpus), gpus, machine)
    if isinstance(gpus, np.ndarray) and gpus.ndim == 1:
        gpus = gpus.tolist()
    _check_not_numbers_in_disguise(gpus, machine)
    if isinstance(gpus, str):
        canonical_or_invalid = _devices_by_names([gpus], gpus, machine)[0]
        raise _invalid(
            gpus, "A single device name is not a device set.", machine,
            f"Pass at least 2 names, e.g. "
            f"{literal([gpus, _another_device(canonical_or_invalid, machine)])}.",
        )
    if not isinstance(gpus, (list, tuple)):
        raise _invalid(
            gpus, f"A value of type {type(gpus).__name__} is not accepted.",
            machine,
        )
    if len(gpus) < 2:
        raise _invalid(
            gpus, f"A device list needs at least 2 entries, not {len(gpus)}.",
            machine, "For a single device use the model itself.",
        )
    if all(is_int(g) for g in gpus):
        devices = _devices_by_ids(gpus, gpus, machine)
    elif all(isinstance(g, str) for g in gpus):
        devices = _devices_by_names(gpus, gpus, machine)
    else:
        junk = [g for g in gpus if not (is_int(g) or isinstance(g, str))]
        problem = (
            f"Entries {literal(junk)} are neither GPU ids nor device names."
            if junk else "The list mixes GPU ids and device names."
        )
        raise _invalid(
            gpus, f"{problem} Entries must be all ints (GPU ids) or all "
            "device-name strings.", machine,
        )
    duplicates = sorted({d for d in devices if devices.count(d) > 1})
    if duplicates:
        raise _invalid(
            gpus, f"Device(s) {literal(duplicates)} appear more than once.", machine,
        )
    return devices


def virtual_devices(n, device_type="CPU", memory_limit=None, threads=None):
    """Splits the first physical device of a type into `n` logical devices.

    Must run before TensorFlow initialises its devices (before the first op,
    model or `list_logical_devices` call). Calling it again with the same `n`
    is harmless. On the JAX backend it sets JAX's number of CPU devices
    (`jax_num_cpu_devices`), which must likewise come before JAX's first
    operation; there only `device_type="CPU"` and `threads=None` apply.

    Args:
        n: Number of logical devices, an int >= 1.
        device_type: `"CPU"` or `"GPU"`.
        memory_limit: For `"GPU"`, the memory of each logical GPU in MiB
            (required). Not accepted for `"CPU"`.
        threads: For `"CPU"`, the compute (intra-op) threads of each logical
            device, in a thread pool of its own, as separate devices have
            their own compute. `None` (the default) gives each device its
            share of the cores, `cores // n` (at least 1), unless the
            program already set intra-op threads (`tf.config.threading`,
            `TF_NUM_INTRAOP_THREADS`), which each device then gets. `0`
            keeps TensorFlow's default: one pool of `cores` threads shared
            by all logical devices. Ignored for one device.

    Returns:
        The names of the logical devices carved out of that physical device,
        e.g. `["/device:CPU:0", "/device:CPU:1"]`.

    Raises:
        ValueError: for an invalid `n`, `device_type` or `memory_limit`, or
            when this machine has no device of that type.
        RuntimeError: when TensorFlow already initialised its devices with a
            different layout; the message says how to fix it.

    Example:
    >>> import multigpu
    >>> multigpu.virtual_devices(4)   # first thing in the program
    ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
    """
    n = check_int("n", n, 1, expected=(
        "an int >= 1 (the number of logical devices to create)"))
    if not isinstance(device_type, str) or device_type.upper() not in (
        "CPU", "GPU"
    ):
        raise ValueError(
            f"Invalid `device_type`: received {literal(device_type)}; expected "
            f"{literals(['CPU', 'GPU'])}."
        )
    device_type = device_type.upper()
    if device_type == "CPU" and memory_limit is not None:
        raise ValueError(
            f"Invalid `memory_limit`: received {literal(memory_limit)} for CPU "
            f"devices; memory_limit applies to GPUs only, leave it {literal(None)}."
        )
    if threads is not None:
        check_int("threads", threads, 0, expected=(
            f"{literal(None)} (each logical CPU device gets its share of the "
            "cores), an int >= 1 (threads per device) or 0 (TensorFlow's one "
            "shared pool)"))
    if device_type == "GPU" and threads is not None:
        raise ValueError(
            f"Invalid `threads`: received {literal(threads)} for GPU devices; "
            f"threads applies to logical CPU devices only, leave it {literal(None)}."
        )
    if device_type == "GPU" and (
        not is_int(memory_limit) or int(memory_limit) <= 0
    ):
        raise ValueError(
            f"Invalid `memory_limit`: received {literal(memory_limit)}; splitting a "
            "GPU needs the memory of each logical GPU in MiB, e.g. "
            f"{setting('memory_limit', 4096)}."
        )
    return runtime.of_backend().virtual_devices(n, device_type, memory_limit,
                                               threads)
