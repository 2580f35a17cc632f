"""The three Transformer architectures, their heads, configs and model directories.

    Encoder (BERT)        encoder.py    + EncoderForPreTraining / ...SequenceClassification / ...TokenClassification
    Decoder (GPT-2)       decoder.py
    Seq2Seq (Vaswani)     seq2seq.py
"""

from lmforge.models.config import (
    PRESETS,
    DecoderConfig,
    EncoderConfig,
    Seq2SeqConfig,
    get_preset,
    load_config,
)
from lmforge.models.decoder import Decoder
from lmforge.models.encoder import (
    Encoder,
    EncoderForPreTraining,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from lmforge.models.heads import (
    LMHead,
    MaskedLMHead,
    NextSentenceHead,
    SequenceClassificationHead,
    TokenClassificationHead,
)
from lmforge.models.outputs import ModelOutput
from lmforge.models.registry import build_model, count_parameters, load_pretrained, save_pretrained
from lmforge.models.seq2seq import Seq2Seq

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderConfig",
    "Encoder",
    "EncoderConfig",
    "EncoderForPreTraining",
    "EncoderForSequenceClassification",
    "EncoderForTokenClassification",
    "LMHead",
    "MaskedLMHead",
    "ModelOutput",
    "NextSentenceHead",
    "Seq2Seq",
    "Seq2SeqConfig",
    "SequenceClassificationHead",
    "TokenClassificationHead",
    "build_model",
    "count_parameters",
    "get_preset",
    "load_config",
    "load_pretrained",
    "save_pretrained",
]
