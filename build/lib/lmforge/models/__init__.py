"""The three Transformer architectures, their heads, configs and model directories.

    Encoder (BERT)        encoder.py    + EncoderForPreTraining / ...SequenceClassification / ...TokenClassification
    Decoder (GPT-2)       decoder.py
    Seq2Seq (Vaswani)     seq2seq.py
    RNNSeq2Seq            rnn_seq2seq.py  BiLSTM encoder, LSTM decoder with attention (Bahdanau / Luong)
    BiLM (ELMo)           elmo.py       + BiLMForSequenceClassification / ...TokenClassification, BiLMConfig
    SentenceCNN           cnn.py        + CNNForSequenceClassification (seed 001 problem 3)
    GridCaptioner         captioning.py   caption decoder attending over a feature grid M[x, y, K] (seed 001 p2)
    DualEncoder           dual_encoder.py two towers, InfoNCE, recall@k, CrossModalBlock (seed 000 Q7-8)
"""

from lmforge.models.captioning import GridCaptioner, GridCaptionerConfig
from lmforge.models.cnn import CNNConfig, CNNForSequenceClassification, SentenceCNN
from lmforge.models.config import (
    PRESETS,
    DecoderConfig,
    EncoderConfig,
    RNNSeq2SeqConfig,
    Seq2SeqConfig,
    get_preset,
    load_config,
)
from lmforge.models.decoder import Decoder
from lmforge.models.dual_encoder import CrossModalBlock, DualEncoder, DualEncoderConfig
from lmforge.models.elmo import BiLM, BiLMConfig, BiLMForSequenceClassification, BiLMForTokenClassification
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
from lmforge.models.rnn_seq2seq import RNNSeq2Seq
from lmforge.models.seq2seq import Seq2Seq

__all__ = [
    "PRESETS",
    "BiLM",
    "BiLMConfig",
    "BiLMForSequenceClassification",
    "BiLMForTokenClassification",
    "CNNConfig",
    "CNNForSequenceClassification",
    "CrossModalBlock",
    "Decoder",
    "DecoderConfig",
    "DualEncoder",
    "DualEncoderConfig",
    "Encoder",
    "EncoderConfig",
    "EncoderForPreTraining",
    "EncoderForSequenceClassification",
    "EncoderForTokenClassification",
    "GridCaptioner",
    "GridCaptionerConfig",
    "LMHead",
    "MaskedLMHead",
    "ModelOutput",
    "NextSentenceHead",
    "RNNSeq2Seq",
    "RNNSeq2SeqConfig",
    "SentenceCNN",
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
