"""What this machine and this multigpu offer, found in a throwaway process.

`python -m bench.lockstep.probe` prints one JSON object: the environment recorded
with the results (TensorFlow, Keras, devices, cores) and the
`multi_gpu_model` variants to benchmark. The engines come from what
`multi_gpu_model` accepts (its `engine` parameter, if any), so a new engine
is benchmarked as soon as it lands.
"""

import inspect
import json
import os
import platform
import sys

CANDIDATE_ENGINES = ("replicate", "mirrored")


def cpu_model():
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_names(tf):
    """Names of the physical GPUs, e.g. `["NVIDIA A100-SXM4-40GB"]`."""
    names = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        names.append(details.get("device_name", gpu.name))
    return names


def declared_engines(multi_gpu_model):
    """Engines `multi_gpu_model` declares, and its default.

    Returns:
        `(engines, default)`: `([None], None)` when `multi_gpu_model` has no
        `engine` parameter (one engine, whatever it does); otherwise the
        package's `ENGINES` constant if it has one (else the known
        candidates) and the parameter's default.
    """
    parameter = inspect.signature(multi_gpu_model).parameters.get("engine")
    if parameter is None:
        return [None], None
    engines = None
    for name, module in sorted(sys.modules.items()):
        if name.startswith("multigpu") and hasattr(module, "ENGINES"):
            engines = list(module.ENGINES)
            break
    default = parameter.default
    if default is inspect.Parameter.empty:
        default = None
    return engines or list(CANDIDATE_ENGINES), default


def accepted_variants(multigpu, engines, count):
    """The (engine, cpu_merge) pairs `multi_gpu_model` accepts.

    Each pair is tried on a tiny model over `count` devices; a `ValueError`
    (an unknown engine, or a flag that engine rejects) leaves it out.

    Returns:
        `(variants, rejected)`: a list of `{"engine", "cpu_merge"}` dicts and
        a list of `{"engine", "cpu_merge", "reason"}` dicts.
    """
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    from bench.lockstep.worker import gpus_argument

    gpus = gpus_argument(count)
    variants, rejected = [], []
    for engine in engines:
        # engine="auto" with cpu_merge=False runs the replicate engine
        # merging on the first device: replicate_device_merge again.
        for cpu_merge in ((True,) if engine == "auto" else (True, False)):
            kwargs = {"cpu_merge": cpu_merge}
            if engine is not None:
                kwargs["engine"] = engine
            try:
                multigpu.multi_gpu_model(model, gpus=gpus, **kwargs)
            except ValueError as error:
                rejected.append(dict(engine=engine, cpu_merge=cpu_merge,
                                     reason=str(error).split(".")[0]))
                continue
            variants.append(dict(engine=engine, cpu_merge=cpu_merge))
    return variants, rejected


def probe():
    """The environment and the variants, as a JSON-serialisable dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    import keras
    import numpy
    import tensorflow as tf

    import multigpu
    from multigpu.devices import usable_cores

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        multigpu.virtual_devices(2)
    engines, default = declared_engines(multigpu.multi_gpu_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        variants, rejected = accepted_variants(
            multigpu, engines, 2 if len(gpus) != 1 else 1)
    return {
        "device_type": "GPU" if gpus else "CPU",
        "num_gpus": len(gpus),
        "gpu_names": gpu_names(tf),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": numpy.__version__,
        "multigpu": getattr(multigpu, "__version__", "unknown"),
        "platform": platform.platform(),
        "engines": [e for e in engines if e is not None] or ["(single)"],
        "default_engine": default,
        "variants": variants,
        "rejected_variants": rejected,
    }


if __name__ == "__main__":
    print("BENCH_PROBE " + json.dumps(probe()))
