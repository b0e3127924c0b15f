"""`model_parallel`: one model across devices, cut into stages (TensorFlow) or
with each weight split across them (JAX, `jax_sharding`).
"""
