"""One benchmark configuration, run in a process of its own.

`python -m bench.lockstep.worker CONFIG.json` trains one workload with one
configuration, one epoch or `predict` call at a time as the orchestrator
grants them (see `bench.lockstep.protocol`). Each configuration gets its own process
because logical devices are fixed when TensorFlow starts, two
MirroredStrategy objects over different device sets collide in one process,
and `ru_maxrss` is per process.

A config is a dict with keys `workload`, `runner` (`"plain"`,
`"multi_gpu_model"` or `"mirrored_by_hand"`), `devices` (an int), `engine`
and `cpu_merge` (for `multi_gpu_model`; None means its default),
`batch_size`, `epochs` (warm-up included), `predict_calls` and `seed`.
"""

import json
import os
import sys
import time

RUNNERS = ("plain", "multi_gpu_model", "mirrored_by_hand")


def configure_devices(count, runner):
    """Makes `count` devices visible before TensorFlow starts.

    On a machine with GPUs the first `count` GPUs are kept visible (so
    `gpus=None` means exactly those); without GPUs the CPU is split into
    `count` logical devices, except for plain Keras, which runs on the
    CPU as TensorFlow configures it by default.

    Returns:
        The device type used, `"GPU"` or `"CPU"`.
    """
    import tensorflow as tf

    import multigpu

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if count > len(gpus):
            raise ValueError(f"{count} devices asked for, {len(gpus)} GPUs here")
        tf.config.set_visible_devices(gpus[:count], "GPU")
        for gpu in gpus[:count]:
            tf.config.experimental.set_memory_growth(gpu, True)
        return "GPU"
    if runner != "plain":
        multigpu.virtual_devices(count)
    return "CPU"


def device_names(kind, count):
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices(kind)][:count]


def build_plain(workload, config, devices):
    """Plain Keras on one device: the reference."""
    from bench import models

    model = models.build_model(workload)
    model.compile(**models.compile_args())
    return model, devices[:1]


def build_multi_gpu_model(workload, config, devices):
    """`multigpu.multi_gpu_model` with the config's engine and cpu_merge."""
    import multigpu
    from bench import models

    kwargs = {}
    if config.get("engine") is not None:
        kwargs["engine"] = config["engine"]
    if config.get("cpu_merge") is not None:
        kwargs["cpu_merge"] = bool(config["cpu_merge"])
    parallel = multigpu.multi_gpu_model(models.build_model(workload),
                                        gpus=gpus_argument(len(devices)),
                                        **kwargs)
    parallel.compile(**models.compile_args())
    return parallel, list(parallel.devices)


def build_mirrored_by_hand(workload, config, devices):
    """What a user writes from the MirroredStrategy guide (seed 004)."""
    import tensorflow as tf

    from bench import models

    strategy = tf.distribute.MirroredStrategy(devices=devices)
    with strategy.scope():
        model = models.build_model(workload)
        model.compile(**models.compile_args())
    return model, list(strategy.extended.worker_devices)


BUILDERS = {
    "plain": build_plain,
    "multi_gpu_model": build_multi_gpu_model,
    "mirrored_by_hand": build_mirrored_by_hand,
}


def load_config(path):
    """Reads a worker config (JSON)."""
    with open(path) as stream:
        return json.load(stream)


def gpus_argument(count):
    """`gpus=` for `multi_gpu_model` on `count` visible devices."""
    return int(count) if int(count) >= 2 else None


def run(config, channel):
    """Runs one configuration under the orchestrator's control.

    Sends `ready` once the model is built and compiled, trains
    `warmup_epochs + epochs` epochs and runs `predict_calls` predictions, one
    granted unit at a time, then on `finish` sends `done` with the peak
    memory.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bench.lockstep import memory

    lock_problem = memory.lock_memory()
    runner = config["runner"]
    if runner not in RUNNERS:
        raise ValueError(f"unknown runner {runner!r}; expected {RUNNERS}")
    kind = configure_devices(int(config["devices"]), runner)

    import keras

    from bench import models
    from bench.lockstep import timer

    keras.utils.set_random_seed(int(config["seed"]))
    workload = config["workload"]
    x, y = models.load_data(workload, int(config["seed"]), config.get("rows"))
    devices = device_names(kind, int(config["devices"]))
    model, used = BUILDERS[runner](workload, config, devices)
    batch_size = int(config["batch_size"])
    announce(channel, model, used, len(x), memory_locked=not lock_problem)
    model.fit(x, y, batch_size=batch_size, epochs=int(config["epochs"]),
              callbacks=[timer.LockstepTimer(channel)], verbose=0)
    timed_predictions(
        channel, lambda: model.predict(x, batch_size=batch_size, verbose=0),
        config["predict_calls"])
    finish(channel, used)


def timed_predictions(channel, predict, calls):
    """Runs `predict()` `calls` times, each when granted, and reports it.

    Args:
        channel: The worker's `Channel`.
        predict: A function of no arguments (from R too, via reticulate).
        calls: How many calls, warm-up included.
    """
    from bench.lockstep import timer

    for _ in range(int(calls)):
        channel.wait()
        started, cpu_started = time.perf_counter(), time.process_time()
        faults = timer.major_faults()
        predict()
        channel.send("predict", seconds=time.perf_counter() - started,
                     cpu_seconds=time.process_time() - cpu_started,
                     major_faults=timer.major_faults() - faults)


def announce(channel, model, used, num_samples, driver="python",
             api="python", memory_locked=False):
    """Sends `ready`: what runs, on which devices, on how many rows."""
    if isinstance(used, str):  # R's one-element vector arrives as a string
        used = [used]
    channel.send("ready", driver=driver, api=api,
                 devices_used=[str(d) for d in used],
                 engine_used=getattr(model, "engine", None),
                 num_samples=int(num_samples),
                 memory_locked=bool(memory_locked))


def finish(channel, used):
    """Waits for `finish`, then reports peak memory in `done`."""
    from bench.lockstep import memory

    channel.wait()
    channel.send("done", peak_rss_mib=memory.peak_rss_mib(),
                 peak_device_mib=memory.peak_device_mib(list(used)))


def report_errors(channel, function, *args):
    """Runs `function(*args)`; a failure is also reported on `channel`."""
    try:
        function(*args)
    except Exception as error:
        channel.send("error", message=f"{type(error).__name__}: {error}")
        raise


def main(argv=None):
    import faulthandler
    import signal

    from bench.lockstep import protocol

    # The orchestrator sends SIGUSR1 to a worker that stopped reporting:
    # its Python stacks go to the worker's log before it is killed.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    argv = sys.argv[1:] if argv is None else argv
    channel = protocol.Channel.from_env()
    report_errors(channel, run, load_config(argv[0]), channel)


if __name__ == "__main__":
    main()
