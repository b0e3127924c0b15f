"""`multi_gpu_model`: the front, the engine choice, the template and what
every engine shares, independent of the Keras backend. The engines
themselves live in a folder per backend (`engines/tensorflow`).
"""
