"""The training step every engine runs (TensorFlow): the non-finite guard,
the stateless forward pass, the update once on the summed gradient and
graph-scoped gradients.
"""
