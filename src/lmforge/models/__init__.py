"""The architectures, their heads, configs and model directories.

    encoder.py       Encoder (BERT) + EncoderForPreTraining / ...SequenceClassification / ...TokenClassification
    decoder.py       Decoder (GPT-2, and the modern decoder by its config's switches: RMSNorm, rotary, GQA, ...)
    seq2seq.py       Seq2Seq (Vaswani et al. 2017), the Transformer encoder-decoder
    rnn_seq2seq.py   RNNSeq2Seq: BiLSTM encoder, LSTM decoder with attention (Bahdanau / Luong)
    elmo.py          BiLM (ELMo) + BiLMForSequenceClassification / ...TokenClassification
    cnn.py           SentenceCNN + CNNForSequenceClassification (seed 001 problem 3)
    captioning.py    GridCaptioner: a caption decoder attending over a feature grid M[x, y, K] (seed 001 p2)
    dual_encoder.py  DualEncoder: two towers, InfoNCE, recall@k, CrossModalBlock (seed 000 Q7-8)
    heads.py         output heads: LM, masked LM, next sentence, sequence and token classification
    config.py        one config dataclass per architecture (config.json), the presets
    registry.py      model directories: build from a config, save and load weights, count parameters
    unwritten.py     models built without initialising the weights a load is about to assign
    strategies.py    the four fine-tuning strategies as model surgery, task heads on a backbone
    interfaces.py    what generic code may assume of a model (EncoderDecoder, ...): explicit Protocols
    outputs.py       ModelOutput: what every forward returns
    common.py        weight initialisation and input checks shared by the models
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
