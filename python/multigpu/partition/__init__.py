"""`model_parallel`: one model cut into stages across devices (TensorFlow).
"""
