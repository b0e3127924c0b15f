"""Tiny KerasHub tasks built from small configurations (nothing downloaded).

Shared by the Python tests. Dropout is off, so one training step is
deterministic and comparable with the template's. Each factory seeds
Keras first: two calls build two tasks with equal weights.
"""

import keras
import keras_hub
import numpy as np

VOCABULARY = 50
SEQUENCE = 8


def _seeded(seed):
    keras.utils.set_random_seed(seed)


def gpt2_causal_lm(seed=1):
    """A GPT-2 causal LM: one block, tied input and output embeddings."""
    _seeded(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=SEQUENCE, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def llama_causal_lm(seed=1):
    """A Llama causal LM: one block, grouped-query attention."""
    _seeded(seed)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=8, intermediate_dim=16)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def bert_text_classifier(seed=1):
    """A BERT text classifier (dict inputs: tokens, segments, mask)."""
    _seeded(seed)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=SEQUENCE, dropout=0.0)
    return keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0)


def vit_image_classifier(seed=1):
    """A ViT image classifier over 16x16 images in 8x8 patches."""
    _seeded(seed)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=8, num_layers=1, num_heads=2,
        hidden_dim=8, mlp_dim=16)
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=3, preprocessor=None)


def token_batch(rng, rows, segments=False):
    """Token ids and a padding mask (the last rows padded), and labels."""
    mask = np.ones((rows, SEQUENCE), "int32")
    mask[rows // 2:, SEQUENCE - 2:] = 0
    x = {"token_ids": rng.integers(0, VOCABULARY, (rows, SEQUENCE)).astype(
        "int32"), "padding_mask": mask}
    if segments:
        x["segment_ids"] = np.zeros((rows, SEQUENCE), "int32")
    return x
