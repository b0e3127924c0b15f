"""Softmax and sigmoid outputs keep their logits through every engine.

Keras's cross-entropy losses read the logits a softmax or sigmoid output
carries (`_keras_logits`) instead of log(clip(p)). On a saturated output the
two differ by orders of magnitude (a loss of hundreds from the logits, 16.1
from a probability clipped at 1e-7) and so do the gradients (clipping gives
none). Each engine merges its replicas' or stages' outputs into new tensors,
which must carry the logits again (`forward.with_logits`). One model with a
saturated head per cross-entropy, spelled as a string and as a loss object,
is trained one SGD step on every engine and on its own; the loss of each
head and its weights after the step must be the template's.
"""

import keras
import numpy as np
import pytest

import multigpu
from multigpu.engines import front as engines
from support.models import copy_of

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = pytest.mark.zoo(axes=("engine",), scope="module")

# (cross-entropy, output activation); each trains under both spellings.
CROSS_ENTROPIES = (
    ("categorical_crossentropy", "softmax",
     keras.losses.CategoricalCrossentropy),
    ("sparse_categorical_crossentropy", "softmax",
     keras.losses.SparseCategoricalCrossentropy),
    ("binary_crossentropy", "sigmoid", keras.losses.BinaryCrossentropy),
)
SPELLINGS = ("string", "object")
HEADS = [(f"{name}_{spelling}", name, activation,
          name if spelling == "string" else loss_class())
         for name, activation, loss_class in CROSS_ENTROPIES
         for spelling in SPELLINGS]
# Splits evenly: Keras weights its per-output loss metrics by a static batch
# size, which a replica's share does not have.
ROWS = 8

ENGINES = {
    **{engine: (lambda t, engine=engine: multigpu.multi_gpu_model(
        t, gpus=2, engine=engine))
       for engine in engines.ENGINES if engine != "auto"},
    "model_parallel": lambda t: multigpu.model_parallel(t, devices=2),
    "model_parallel_microbatches": lambda t: multigpu.model_parallel(
        t, devices=2, microbatches=2),
}


def _saturated_model():
    """A hidden layer, then one head per loss whose logits are in the hundreds."""
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    large = keras.initializers.RandomNormal(stddev=100.0, seed=3)
    outputs = [keras.layers.Dense(3, activation=activation, name=head,
                                  kernel_initializer=large)(hidden)
               for head, _, activation, _ in HEADS]
    return keras.Model(inputs, outputs, name="saturated")


def _wrong_labels(model, x):
    """Per head, the labels the saturated outputs get most wrong."""
    labels = []
    for probabilities, (_, name, _, _) in zip(model.predict(x, verbose=0),
                                              HEADS):
        least = probabilities.argmin(axis=1)
        if name == "categorical_crossentropy":
            labels.append(np.eye(3, dtype="float32")[least])
        elif name == "sparse_categorical_crossentropy":
            labels.append(least.astype("int32"))
        else:
            labels.append((probabilities < 0.5).astype("float32"))
    return labels


def _one_step(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=[loss for _, _, _, loss in HEADS])
    logs = model.train_on_batch(x, y, return_dict=True)
    return {head: logs[f"{head}_loss"] for head, _, _, _ in HEADS}


@pytest.fixture(scope="module")
def reference():
    """The template, its data, and its losses and weights after one step."""
    keras.utils.set_random_seed(5)
    template = _saturated_model()
    x = np.random.default_rng(5).standard_normal((ROWS, 4)).astype("float32")
    y = _wrong_labels(template, x)
    alone = copy_of(template)
    losses = _one_step(alone, x, y)
    weights = {layer.name: layer.get_weights() for layer in alone.layers}
    return template, x, y, losses, weights


def test_the_reference_heads_are_saturated(reference):
    template, _, _, losses, weights = reference
    # From logits the loss is in the hundreds; from clipped probabilities it
    # would be at most -log(1e-7) = 16.1 per row.
    assert min(losses.values()) > 50, losses
    moved = [float(np.max(np.abs(before - after)))
             for before, after in zip(template.get_layer(HEADS[0][0])
                                      .get_weights(), weights[HEADS[0][0]])]
    assert max(moved) > 1e-2


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_cross_entropy_of_saturated_outputs_matches_the_template(
        reference, engine):
    template, x, y, losses, weights = reference
    parallel = ENGINES[engine](copy_of(template))
    parallel_losses = _one_step(parallel, x, y)
    parallel.copy_to_template()
    trained = parallel.template
    assert parallel_losses == pytest.approx(losses, rel=1e-5), engine
    for head, _, _, _ in HEADS:
        for got, expected in zip(trained.get_layer(head).get_weights(),
                                 weights[head]):
            np.testing.assert_allclose(
                got, expected, rtol=1e-5, atol=1e-4,
                err_msg=f"{engine}: weights of {head} after one SGD step")
    for got, expected in zip(trained.get_layer("hidden").get_weights(),
                             weights["hidden"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
