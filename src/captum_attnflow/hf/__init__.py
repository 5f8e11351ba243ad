"""The model boundary: everything that touches a Hugging Face model (or a module wrapping one).

Attention capture and the eager switch, padding positions, class scores, input embeddings,
token-id and device checks, and leaving the model exactly as it was. Other packages use the
names this package exports, never its private modules.
"""
