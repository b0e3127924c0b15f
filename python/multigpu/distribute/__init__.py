"""Strategy-scoped training (TensorFlow `tf.distribute`): strategies,
datasets batched for them, checked inputs, and `fit_distributed`.
"""
