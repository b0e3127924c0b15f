"""The TensorFlow engines of `multi_gpu_model`: the replicate engine, the
mirrored engine, and the forward path and BatchNormalization pooling they share.
"""
