"""The JAX engine of `multi_gpu_model`: XLA splits each batch across devices.

`mesh` places the template's variables on every device and constrains each
batch along the devices' `"batch"` axis; `sharded.ShardedModel` is the model
`multi_gpu_model` returns on the JAX backend.
"""
