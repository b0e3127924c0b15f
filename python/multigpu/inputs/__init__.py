"""The data given to the engines' `fit`, `evaluate` and `predict`, checked first.

Keras answers some bad data late and unclearly, and through an engine
(batches sliced between devices, or a `tf.distribute` strategy) less
clearly still: `fit` of 0 rows returns an empty history, `predict` of 0 rows
raises `UnboundLocalError`, the mirrored engine a bare `StopIteration`; a
ragged tensor fails in a replica's gradient with `AttributeError ... 'op'`;
labels out of range abort a step on a CPU and give NaN on a GPU; class
weights keyed by strings are silently ignored, and `batch_size=0` silently
means 32.

`checked_call` runs one of those methods of a model of this package
(`multigpu.engines.template.TemplateBacked`) with its arguments checked
first (`multigpu.inputs.calls`). Each check
refuses one kind of input with a `ValueError` that names the argument, the
value and the fix; inputs Keras refuses clearly itself are left to Keras,
and plain Keras models are not touched. It imports no TensorFlow: every
engine checks its data here, and a TensorFlow value (`is_tensorflow`) is
recognised only once TensorFlow is imported. `check_rows` also serves
`placement_report`, `check_batched` `fit_distributed`. `bound_arguments`
names the arguments of a call of a `keras.Model` method, for the checks
here and for the engines that rewrite `fit`'s or `compile`'s arguments.

The checks of the data's rows, shapes and types are `multigpu.inputs.data`;
those of the targets against the model's losses, the sample weights and
the class weights `multigpu.inputs.labels`; the call's arguments bound and
checked, and the call run, `multigpu.inputs.calls`.
"""

from multigpu.inputs.calls import (
    bound_arguments,
    check_batch_size,
    check_data,
    checked_call,
    no_batch_error,
)
from multigpu.inputs.data import (
    check_batched,
    check_numeric_y,
    check_rows,
    is_dataset,
    is_tensorflow,
)
from multigpu.inputs.labels import check_no_r_na

__all__ = ["bound_arguments", "check_batch_size", "check_batched",
           "check_data", "check_no_r_na", "check_numeric_y", "check_rows",
           "checked_call", "is_dataset", "is_tensorflow", "no_batch_error"]
