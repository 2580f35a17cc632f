"""Model directories in and out: Hugging Face checkpoints both ways, Llama-family folders, PEFT, GGUF.

    directories.py  lmforge.load for any directory or file it reads; the outputs of fine-tuning
    huggingface.py  Hugging Face BERT and GPT-2 directories, both ways (convert --from-hf / --to-hf)
    bert.py         BERT's Hugging Face weight names <-> lmforge's Encoder and its heads
    gpt2.py         GPT-2's Hugging Face weight names <-> lmforge's Decoder
    llama.py        Llama-family checkpoints <-> the one Decoder with its modern switches
    peft.py         a LoRA fine-tune as Hugging Face PEFT reads it, or merged into a plain model
    gguf.py         GGUF (llama.cpp's one-file format) read: the model, its tokenizer, tensors kept or quantized
    gguf_write.py   GGUF written (convert --to-gguf): metadata, tokenizer, tensors in llama.cpp's names
    gguf_file.py    the GGUF container read by hand: every declared size checked against the file first
    kquants.py      llama.cpp's K-quant blocks (Q4_K, Q5_K, Q6_K) dequantized, as ggml computes them
"""

from lmforge.interop.huggingface import convert_from_hf, convert_to_hf, is_hf_dir, load_hf
from lmforge.interop.llama import load_llama_folder

__all__ = ["convert_from_hf", "convert_to_hf", "is_hf_dir", "load_hf", "load_llama_folder"]
