"""lmforge: build, pretrain, fine-tune and inspect Transformer language models.

The packages follow the flow of the course (see docs/ and DESIGN):
``reference`` (NumPy equations) → ``tokenizers`` → ``nn`` (attention, layers) → ``models`` →
``data`` → ``train`` → fine-tuning, generation and inspection.
"""

__version__ = "0.1.0"
