"""The epoch a seeded dataset shuffles for is the dataset's own (no process state)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.checkpoints import epochs
from support.models import data, mlp


def _rows(dataset):
    return np.concatenate([np.asarray(batch[0]) for batch in dataset])


def test_a_clock_counts_iterations_and_uses_an_announcement_once():
    clock = epochs.EpochClock()
    assert [clock.next_epoch(), clock.next_epoch()] == [0, 1]
    clock.announce(7)
    assert [clock.next_epoch(), clock.next_epoch()] == [7, 8]
    with pytest.raises(ValueError, match=r"`epoch`: received -1"):
        clock.announce(-1)


def test_only_seeded_shuffles_have_a_clock(rng):
    x, y = data(rng, 16)
    assert epochs.epoch_clock(multigpu.distributed_dataset(x, y, 4)) is None
    assert epochs.epoch_clock(multigpu.distributed_dataset(
        x, y, 4, shuffle=True)) is None
    assert isinstance(epochs.epoch_clock(multigpu.distributed_dataset(
        x, y, 4, shuffle=True, seed=1)), epochs.EpochClock)


def test_an_announcement_to_one_dataset_leaves_another_alone(rng):
    x, y = data(rng, 32)
    reference, first, second = (multigpu.distributed_dataset(
        x, y, 4, shuffle=True, seed=5) for _ in range(3))
    epoch_0, epoch_1 = _rows(reference), _rows(reference)
    assert not np.array_equal(epoch_0, epoch_1)
    epochs.epoch_clock(first).announce(1)
    np.testing.assert_array_equal(_rows(second), epoch_0)
    np.testing.assert_array_equal(_rows(second), epoch_1)
    np.testing.assert_array_equal(_rows(first), epoch_1)


class _CrashInEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("crash")


def _train(x, y, epochs_=2):
    """Weights after a seeded-shuffle training with no checkpoints."""
    keras.utils.set_random_seed(3)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    dataset = multigpu.distributed_dataset(x, y, 4, shuffle=True, seed=5)
    model.fit(dataset, epochs=epochs_, verbose=0)
    return model.get_weights()


def test_two_trainings_in_one_process_do_not_share_the_epoch(rng, tmp_path):
    x, y = data(rng, 32)
    before = _train(x, y)
    # A training with checkpoints, stopped by an error in its third epoch:
    # the epoch it announced to its data must not reach the next training.
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    crashed = multigpu.distributed_dataset(x, y, 4, shuffle=True, seed=5)
    with pytest.raises(RuntimeError, match="crash"):
        model.fit(crashed, epochs=5, verbose=0, callbacks=[
            *multigpu.checkpoint_callbacks(tmp_path, data=crashed),
            _CrashInEpoch(2)])
    after = _train(x, y)
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)


def test_checkpoint_callbacks_announce_each_epoch_to_their_data(rng, tmp_path):
    x, y = data(rng, 16)
    dataset = multigpu.distributed_dataset(x, y, 4, shuffle=True, seed=5)
    announced = []
    clock = epochs.epoch_clock(dataset)
    real = clock.announce
    clock.announce = lambda epoch: (announced.append(epoch), real(epoch))
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset, epochs=3, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path, data=dataset))
    assert announced == [0, 1, 2]


# Full tier: the epoch callbacks run under fit in the gate's other tests here.
@pytest.mark.full
def test_fit_distributed_gives_its_dataset_to_the_checkpoint_callbacks(
        rng, tmp_path):
    strategy = multigpu.mirrored_strategy(2)
    x, y = data(rng, 16)
    dataset = multigpu.distributed_dataset(x, y, 4, strategy=strategy,
                                           shuffle=True, seed=5)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    callbacks = multigpu.checkpoint_callbacks(tmp_path)
    multigpu.fit_distributed(model, dataset, epochs=1, verbose=0,
                             callbacks=callbacks)
    assert callbacks[0].data is dataset


def test_data_that_is_not_a_dataset_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"^Invalid `data`: .*ndarray"):
        multigpu.checkpoint_callbacks(tmp_path, data=np.zeros((4, 2)))


def test_data_that_cannot_be_replayed_is_warned_about(rng, tmp_path):
    x, y = data(rng, 16)
    shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16).batch(4)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match=r"cannot be replayed exactly \(it "
                      r"shuffles with Dataset\.shuffle"):
        model.fit(shuffled, epochs=1, verbose=0, callbacks=
                  multigpu.checkpoint_callbacks(tmp_path, data=shuffled))
