"""The main job: train a digit classifier across simulated devices.

Run with `python -m multigpu.demo --devices 4` (or `make demo`). Uses
scikit-learn's bundled 8x8 digit images (1,797 real scans; no download), a
small CNN, and `multi_gpu_model` over `--devices` logical CPU devices (or the
GPUs, on a GPU machine), then saves and reloads the trained model.
"""

import argparse
import os
import pathlib
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4,
                        help="logical CPU devices to simulate (default 4)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default="out/digits.keras",
                        help="where the trained model is saved")
    return parser.parse_args(argv)


def load_digits(seed=0):
    """Digits as train, validation and test splits, images scaled to [0, 1].

    Returns:
        `((x_train, y_train), (x_val, y_val), (x_test, y_test))`.
    """
    import numpy as np
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=seed,
        stratify=digits.target)
    x_train, x_val, y_train, y_val = train_test_split(
        x_train, y_train, test_size=0.1, random_state=seed, stratify=y_train)
    return (x_train, y_train), (x_val, y_val), (x_test, y_test)


def build_model():
    import keras

    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="digit")(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import multigpu

    simulated = multigpu.virtual_devices(args.devices)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    (x_train, y_train), validation, (x_test, y_test) = load_digits()
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; "
          f"simulated devices: {simulated}")
    print(f"Data: scikit-learn digits (8x8 scans): {len(x_train)} training, "
          f"{len(validation[0])} validation and {len(x_test)} test images")

    template = build_model()
    gpus = None if tf.config.list_logical_devices("GPU") else args.devices
    parallel = multigpu.multi_gpu_model(template, gpus=gpus)
    print(f"Replicas on {len(parallel.devices)} devices; each batch of "
          f"{args.batch_size} is split as:")
    for device, rows in parallel.batch_split(args.batch_size):
        print(f"  {device}: {rows} rows")
    last = len(x_train) % args.batch_size
    if last:
        split = ", ".join(str(rows) for _, rows in parallel.batch_split(last))
        print(f"  (the last batch of each epoch has {last} rows: {split})")

    parallel.compile(optimizer=keras.optimizers.Adam(3e-3),
                     loss="sparse_categorical_crossentropy",
                     metrics=["accuracy"])
    started = time.perf_counter()
    parallel.fit(x_train, y_train, epochs=args.epochs,
                 batch_size=args.batch_size, validation_data=validation, verbose=1)
    seconds = time.perf_counter() - started
    loss, accuracy = parallel.evaluate(x_test, y_test, verbose=0)
    print(f"Trained {args.epochs} epochs in {seconds:.1f} s; "
          f"test accuracy {accuracy:.4f} (loss {loss:.4f})")

    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    parallel.save(output)  # writes the template: a plain Keras model
    reloaded = keras.models.load_model(output)
    _, reloaded_accuracy = reloaded.evaluate(x_test, y_test, verbose=0)
    print(f"Saved the trained model to {output} (a plain Keras model; "
          f"reloaded test accuracy {reloaded_accuracy:.4f})")
    return accuracy


if __name__ == "__main__":
    main()
