"""Training for the embedded target/draft pair and the ``train_draft`` user feature.

data.py    text -> token streams, windows, held-out prompts
modules.py training-time replacements inside the target (grouped MoE, dropout, expert-load counts)
target.py  pretraining loop for a small DeepSeek-V3-architecture target
draft.py   EAGLE-3 draft training with training-time test, draft vocab, accept-length simulation
io.py      writing checkpoints the engine's loaders read
"""
