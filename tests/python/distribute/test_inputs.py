"""Bad inputs get a clear error at the boundary, naming the argument and the fix.

One table: a bad input to a model of each engine (or to a strategy), the
error class it must raise and a fragment of the message. Before these
checks, such inputs surfaced as raw TensorFlow errors (`Mixing different
tf.distribute.Strategy objects`, `colocate_vars_with ...`, `merge_call
called while defining a new graph`), as Python errors from deep inside
Keras (`UnboundLocalError`, a bare `StopIteration`, `AttributeError ...
'op'`), or not at all: an empty history, labels of strings silently
ignored as class weights, `batch_size=0` read as 32.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu import inputs
from multigpu.messages import language
from support.models import copy_of, max_weight_difference, mlp

ENGINES = ("replicate", "mirrored", "model_parallel")
ROWS = 10
CLASSES = 3


def _x(rows=ROWS):
    return np.random.default_rng(0).standard_normal((rows, 4)).astype("float32")


def _y(rows=ROWS):
    return (np.arange(rows) % CLASSES).astype("int32")


def _classifier():
    return keras.Sequential(
        [keras.Input((4,), name="features"),
         keras.layers.Dense(5, activation="relu", name="hidden"),
         keras.layers.Dense(CLASSES, activation="softmax", name="scores")],
        name="classifier")


def _spread(template, engine):
    if engine == "model_parallel":
        return multigpu.model_parallel(template, 2)
    return multigpu.multi_gpu_model(template, 2, engine=engine)


def _compiled(engine, loss="sparse_categorical_crossentropy"):
    model = _spread(_classifier(), engine)
    model.compile(optimizer="sgd", loss=loss)
    return model


def _dataset(rows=ROWS):
    return tf.data.Dataset.from_tensor_slices((_x(rows), _y(rows)))


def _yielding_nothing():
    # Of unknown size: only iterating it shows it is empty.
    return _dataset().filter(lambda x, y: False).batch(4)


def _ragged():
    return tf.ragged.constant([[1.0, 2.0, 3.0, 4.0]] * (ROWS - 1)
                              + [[1.0, 2.0, 3.0, 4.0, 5.0]])


def _two_strategies():
    return (multigpu.mirrored_strategy(2),
            multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"]))


# -- the strategy-scope mistakes (engine: None, or the engine they involve)


def _built_outside_compiled_inside(_):
    strategy, _ = _two_strategies()
    model = mlp(input_dim=4, outputs=CLASSES)
    with strategy.scope():
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(_x(), _y(), batch_size=4, verbose=0)


def _built_under_one_trained_under_another(_):
    first, second = _two_strategies()
    with first.scope():
        model = mlp(input_dim=4, outputs=CLASSES)
    with second.scope():
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(_x(), _y(), batch_size=4, verbose=0)


def _optimizer_of_another_strategy(_):
    first, second = _two_strategies()
    with first.scope():
        optimizer = keras.optimizers.Adam()
    with second.scope():
        model = mlp(input_dim=4, outputs=CLASSES)
        model.compile(optimizer=optimizer,
                      loss="sparse_categorical_crossentropy")
    model.fit(_x(), _y(), batch_size=4, verbose=0)


def _one_scope_inside_another(_):
    first, second = _two_strategies()
    with first.scope(), second.scope():
        mlp()


def _spread_a_strategy_built_model(engine):
    with multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"]).scope():
        template = _classifier()
    model = multigpu.multi_gpu_model(template, 4, engine=engine)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(_x(), _y(), batch_size=4, verbose=0)


def _spread_inside_a_scope(engine):
    template = _classifier()
    with multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"]).scope():
        model = _spread(template, engine)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(_x(), _y(), batch_size=4, verbose=0)


def _compiled_inside_a_scope(engine):
    model = _spread(_classifier(), engine)
    with multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"]).scope():
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(_x(), _y(), batch_size=4, verbose=0)


def _trained_inside_a_scope(engine):
    model = _compiled(engine)
    with multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"]).scope():
        model.fit(_x(), _y(), batch_size=4, verbose=0)


def _unbatched_to_fit_distributed(_):
    strategy = multigpu.mirrored_strategy(2)
    with strategy.scope():
        model = mlp(input_dim=4, outputs=CLASSES)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    multigpu.fit_distributed(model, _dataset(), verbose=0)


def _placement_report(engine, **targets):
    model = _compiled(engine) if engine else mlp(input_dim=4, outputs=CLASSES)
    if not engine:
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    multigpu.placement_report(model, _x(0), print_table=False, **targets)


Usage = multigpu.StrategyUsageError
SCOPE = r"inside `strategy\.scope\(\)`"

# (case, engines it applies to, what is done, error class, message fragment)
CASES = [
    # 1. strategy-scope mistakes
    ("built outside the scope, compiled and trained inside", [None],
     _built_outside_compiled_inside, Usage,
     r"created outside the strategy's scope.*TensorFlow reports: "
     r"`colocate_vars_with`"),
    ("built under one strategy, trained under another", [None],
     _built_under_one_trained_under_another, Usage,
     r"Two tf\.distribute strategies were mixed.*"
     r"ExplainingMirroredStrategy\(devices=\["),
    ("an optimizer made under another strategy", [None],
     _optimizer_of_another_strategy, Usage,
     r"strategies were mixed.*optimizer was created under another"),
    ("one strategy's scope inside another's", [None],
     _one_scope_inside_another, Usage,
     r"strategies were mixed.*one strategy's scope is opened inside"),
    ("multi_gpu_model of a model built under a strategy",
     ["replicate", "mirrored"], _spread_a_strategy_built_model, Usage,
     r"Invalid `model`: 'classifier' was built inside "
     r"`strategy\.scope\(\)`.*build the model outside any strategy scope"),
    ("multi_gpu_model or model_parallel inside a scope", ENGINES,
     _spread_inside_a_scope, Usage,
     r"(multi_gpu_model|model_parallel)\(\) was called " + SCOPE),
    ("compile inside a scope", ["replicate", "model_parallel"],
     _compiled_inside_a_scope, Usage,
     r"compile\(\) was called " + SCOPE + r".*outside the `with"),
    ("fit inside a scope", ["replicate", "model_parallel"],
     _trained_inside_a_scope, Usage, r"fit\(\) was called " + SCOPE),
    # The mirrored engine's model opens its own strategy's scope first.
    ("compile inside a scope", ["mirrored"], _compiled_inside_a_scope, Usage,
     r"strategies were mixed.*engine='mirrored'\) opens its own strategy's "
     r"scope in compile\(\) and fit\(\): call them outside any other"),
    ("fit inside a scope", ["mirrored"], _trained_inside_a_scope, Usage,
     r"strategies were mixed.*opens its own strategy's scope"),
    # 2. empty data
    ("fit of 0 rows", ENGINES,
     lambda e: _compiled(e).fit(_x(0), _y(0), verbose=0), ValueError,
     r"^Invalid `x`: received 0 rows; expected at least one row: fit\(\) "
     r"would train on nothing"),
    ("evaluate of 0 rows", ENGINES,
     lambda e: _compiled(e).evaluate(_x(0), _y(0), verbose=0), ValueError,
     r"^Invalid `x`: received 0 rows.*evaluate\(\)"),
    ("predict of 0 rows", ENGINES,
     lambda e: _compiled(e).predict(_x(0), verbose=0), ValueError,
     r"^Invalid `x`: received 0 rows.*predict\(\)"),
    ("train_on_batch of 0 rows", ENGINES,
     lambda e: _compiled(e).train_on_batch(_x(0), _y(0)), ValueError,
     r"^Invalid `x`: received 0 rows.*train_on_batch\(\)"),
    ("validation data of 0 rows", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                validation_data=(_x(0), _y(0))),
     ValueError, r"^Invalid `validation_data`: received 0 rows"),
    ("fit of a dataset of 0 batches", ENGINES,
     lambda e: _compiled(e).fit(_dataset(0).batch(4), verbose=0), ValueError,
     r"^Invalid `x`: received a tf\.data\.Dataset of 0 batches"),
    ("fit of a dataset that yields nothing", ENGINES,
     lambda e: _compiled(e).fit(_yielding_nothing(), verbose=0), ValueError,
     r"^Invalid `x`: the dataset yielded no batch.*fit\(\)"),
    ("evaluate of a dataset that yields nothing", ENGINES,
     lambda e: _compiled(e).evaluate(_yielding_nothing(), verbose=0),
     ValueError, r"^Invalid `x`: the dataset yielded no batch.*evaluate"),
    ("predict of a dataset that yields nothing", ENGINES,
     lambda e: _compiled(e).predict(_yielding_nothing(), verbose=0),
     ValueError, r"^Invalid `x`: the dataset yielded no batch.*predict"),
    ("placement_report of 0 rows, training step", [None, "replicate"],
     lambda e: _placement_report(e, y=_y(0)), ValueError,
     r"^Invalid `x`: received 0 rows.*placement_report\(\)"),
    ("placement_report of 0 rows, prediction step", [None, "mirrored"],
     _placement_report, ValueError,
     r"^Invalid `x`: received 0 rows.*placement_report\(\)"),
    # 3. data types and shapes
    ("a ragged x to fit", ENGINES,
     lambda e: _compiled(e).fit(_ragged(), _y(), verbose=0), ValueError,
     r"^Invalid `x`: received a tf\.RaggedTensor.*to_tensor"),
    ("a ragged x to predict", ENGINES,
     lambda e: _compiled(e).predict(_ragged(), verbose=0), ValueError,
     r"^Invalid `x`: received a tf\.RaggedTensor"),
    ("string features", ENGINES,
     lambda e: _compiled(e).fit(_x().astype(str), _y(), verbose=0),
     ValueError, r"^Invalid `x`: received strings \(dtype <U.*float32"),
    ("string features to predict", ["replicate"],
     lambda e: _compiled(e).predict(_x().astype(str), verbose=0),
     ValueError, r"^Invalid `x`: received strings"),
    ("string labels", ENGINES,
     lambda e: _compiled(e).fit(_x(), np.array(list("abcabcabca")),
                                verbose=0),
     ValueError, r"^Invalid `y`: received strings.*integer index"),
    ("a label >= the number of classes", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y() + 1, verbose=0), ValueError,
     r"^Invalid `y`: output 'scores' has 3 classes, so its labels are "
     r"class indices from 0 to 2; received 3 \(in 3 of 10 rows\)"),
    ("a negative label, to evaluate", ENGINES,
     lambda e: _compiled(e).evaluate(_x(), _y() - 1, verbose=0), ValueError,
     r"^Invalid `y`: .*from 0 to 2; received -1 "),
    ("a label out of range, loss object", ["mirrored"],
     lambda e: _compiled(e, keras.losses.SparseCategoricalCrossentropy())
     .fit(_x(), np.full(ROWS, 7), verbose=0),
     ValueError, r"^Invalid `y`: .*received 7 "),
    ("a fractional label", ["replicate"],
     lambda e: _compiled(e).fit(_x(), _y() + 0.5, verbose=0), ValueError,
     r"^Invalid `y`: .*received non-integer labels 0\.5, 1\.5, and 2\.5"),
    ("2-d sample_weight", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                sample_weight=np.ones((ROWS, 2))),
     ValueError,
     r"^Invalid `sample_weight`: received an array of shape \(10, 2\); "
     r"expected one weight per row, shape \(10,\)"),
    ("class_weight missing a class", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                class_weight={0: 1.0, 1: 2.0}),
     ValueError, r"^Invalid `class_weight`: it has no weight for class 2, "
                 r"which `y` holds"),
    ("class_weight keyed by strings", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                class_weight={"0": 1.0, "1": 2.0, "2": 1.0}),
     ValueError, r"^Invalid `class_weight`: its keys must be class indices "
                 r"\(ints\); received '0', '1', and '2'"),
    ("class_weight of a class the output lacks", ["replicate"],
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                class_weight={0: 1, 1: 1, 2: 1, 7: 1}),
     ValueError, r"^Invalid `class_weight`: .*class 7, .*3 classes"),
    ("class_weight missing a class, dataset", ["replicate"],
     lambda e: _compiled(e).fit(_dataset().batch(4), verbose=0,
                                class_weight={0: 1.0, 1: 2.0}),
     ValueError, r"^Invalid `class_weight`: it has no weight for class 2 of "
                 r"output 'scores' \(3 classes\)"),
    ("class_weight as a list", ["mirrored"],
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                class_weight=[1.0, 2.0, 1.0]),
     ValueError, r"^Invalid `class_weight`: received \[1\.0, 2\.0, 1\.0\]; "
                 r"expected None or a dict"),
    ("a negative class weight", ["replicate"],
     lambda e: _compiled(e).fit(_x(), _y(), verbose=0,
                                class_weight={0: -1.0, 1: 1.0, 2: 1.0}),
     ValueError, r"^Invalid `class_weight`: .*numbers >= 0.*\{0: -1\.0\}"),
    ("batch_size 0 to fit", ENGINES,
     lambda e: _compiled(e).fit(_x(), _y(), batch_size=0, verbose=0),
     ValueError, r"^Invalid `batch_size`: received 0; expected None "),
    ("batch_size 0 to predict", ["replicate"],
     lambda e: _compiled(e).predict(_x(), batch_size=0, verbose=0),
     ValueError, r"^Invalid `batch_size`: received 0"),
    ("a negative batch_size to predict", ENGINES,
     lambda e: _compiled(e).predict(_x(), batch_size=-1, verbose=0),
     ValueError, r"^Invalid `batch_size`: received -1"),
    ("a negative batch_size to evaluate", ["mirrored"],
     lambda e: _compiled(e).evaluate(_x(), _y(), batch_size=-4, verbose=0),
     ValueError, r"^Invalid `batch_size`: received -4"),
    ("a fractional batch_size", ["replicate"],
     lambda e: _compiled(e).fit(_x(), _y(), batch_size=2.5, verbose=0),
     ValueError, r"^Invalid `batch_size`: received 2\.5"),
    ("an unbatched dataset to fit", ENGINES,
     lambda e: _compiled(e).fit(_dataset(), verbose=0), ValueError,
     r"^Invalid `x`: received a tf\.data\.Dataset of single examples "
     r"\(shape \(4,\)\); expected batches \(shape \(None, 4\)\)"),
    ("an unbatched dataset to fit_distributed", [None],
     _unbatched_to_fit_distributed, ValueError,
     r"^Invalid `dataset`: received a tf\.data\.Dataset of single examples"),
]


def _cases():
    for case, engines, act, error, match in CASES:
        for engine in engines:
            name = case if engine is None else f"{case} [{engine}]"
            yield pytest.param(engine, act, error, match, id=name)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("engine, act, error, match", _cases())
def test_a_bad_input_gets_a_clear_error(engine, act, error, match):
    with pytest.raises(error, match=match) as raised:
        act(engine)
    assert raised.type is error or issubclass(raised.type, error)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_plain_keras_models_keep_their_own_behaviour():
    model = _classifier()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    # Keras "trains" on 0 rows; the engines' models refuse. Nothing is patched.
    assert model.fit(_x(0), _y(0), verbose=0).history == {}


# The mirrored engine reads its inputs through the replicate engine's checks:
# its case is the full tier's.
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("engine", [
    pytest.param(engine, marks=pytest.mark.full if engine == "mirrored" else ())
    for engine in ENGINES])
def test_good_inputs_next_to_the_bad_ones_pass(engine):
    model = _compiled(engine)
    x, y = _x(), _y()
    model.fit(x, y, batch_size=np.int64(4), verbose=0,
              class_weight={np.int64(0): 1.0, 1: 2.0, 2: 0},
              validation_data=(x, y))
    model.fit(_dataset().batch(4), verbose=0,
              class_weight={0: 1.0, 1: 2.0, 2: 1.0})
    # A new model: Keras's step traced with weights of one rank fails on
    # another ("Cannot take the length of shape with unknown rank").
    other = _compiled(engine)
    other.fit(x, y.astype("float32").reshape(-1, 1), verbose=0,
              sample_weight=np.ones((ROWS, 1)))
    assert model.predict(x, batch_size=3, verbose=0).shape == (ROWS, CLASSES)
    assert model.predict_on_batch(x[:0]).shape == (0, CLASSES)
    assert len(model.evaluate(_dataset().batch(4), verbose=0,
                              return_dict=True)) == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_ignored_class_is_no_label_out_of_range():
    template = _classifier()
    reference = copy_of(template)
    model = _spread(template, "replicate")
    for each in (model, reference):
        each.compile(optimizer="sgd",
                     loss=keras.losses.SparseCategoricalCrossentropy(
                         ignore_class=-1))
    labels = np.where(_y() == 0, -1, _y())
    got = model.fit(_x(), labels, shuffle=False, verbose=0)
    want = reference.fit(_x(), labels, shuffle=False, verbose=0)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=1e-5)
    assert max_weight_difference(template, reference) < 1e-5


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_dataset_with_validation_data_that_yields_nothing_is_named():
    model = _compiled("mirrored")
    with pytest.raises(ValueError,
                       match=r"^Invalid `validation_data`: the dataset "
                             r"yielded no batch"):
        model.fit(_x(), _y(), validation_data=_yielding_nothing(), verbose=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_resumed_run_with_no_epoch_left_is_no_empty_dataset():
    # An epoch range that is already done trains nothing, rightly.
    model = _compiled("replicate")
    history = model.fit(_dataset().batch(4), epochs=2, initial_epoch=2,
                        verbose=0)
    assert history.history == {}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_messages_read_in_r():
    model = _compiled("replicate")
    with language("r"), pytest.raises(
            ValueError, match=r"received 0; expected NULL \(Keras's default"):
        model.fit(_x(), _y(), batch_size=0, verbose=0)
    with language("r"), pytest.raises(
            ValueError, match=r'output "scores" has 3 classes.*received -1 '):
        model.fit(_x(), _y() - 1, verbose=0)


def test_an_r_integer_na_label_is_named_na():
    from multigpu.messages import R_NA_INTEGER, language
    model = _compiled("replicate")
    labels = _y().astype("int32")
    labels[2] = R_NA_INTEGER
    with language("r"), pytest.raises(
            ValueError, match=r"^Invalid `y`: received NA in 1 of 10 rows "
                              r"\(the first is row 3\)"):
        model.fit(_x(), labels, verbose=0)


def test_bound_arguments_name_fit_and_compile_arguments():
    model = mlp()
    x, y = _x(), _y()
    arguments = inputs.bound_arguments("fit", model, (x, y, 5),
                                       {"epochs": 2, "shuffle": False})
    assert "self" not in arguments
    assert arguments["x"] is x and arguments["y"] is y
    assert (arguments["batch_size"], arguments["epochs"]) == (5, 2)
    assert "verbose" not in arguments
    assert inputs.bound_arguments("fit", model, (x,),
                                  defaults=True)["verbose"] == "auto"
    assert inputs.bound_arguments(
        "compile", model, ("sgd", "mse"), {"auto_scale_loss": False}) == {
            "optimizer": "sgd", "loss": "mse", "auto_scale_loss": False}
    # `evaluate`'s **kwargs are merged in by name.
    assert inputs.bound_arguments(
        "evaluate", model, (x,), {"_use_cached_eval_dataset": True}) == {
            "x": x, "_use_cached_eval_dataset": True}
    with pytest.raises(TypeError):
        inputs.bound_arguments("fit", model, (x,), {"x": x})
