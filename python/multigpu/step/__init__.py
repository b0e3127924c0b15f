"""The TensorFlow engines' training step, and what every engine's step shares.

The TensorFlow engines run this step: the non-finite guard (`guard.py`),
the stateless forward pass (`stateless.py`), the update once on the summed
gradient (`train_step.py`) and graph-scoped gradients (`gradients.py`).
The JAX engines run Keras's own compiled step instead, and share two
modules with them: the error and position of a non-finite batch
(`nonfinite.py`) and the chain of wrappers around a model's train function
(`train_function.py`).
"""
