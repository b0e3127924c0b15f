"""The training step every engine runs (TensorFlow): the non-finite guard,
the stateless forward pass, gradient accumulation and graph-scoped gradients.
"""
