"""Hugging Face interop: BERT and GPT-2 checkpoints and their tokenizer files, both ways; Llama-family folders."""

from lmforge.interop.huggingface import convert_from_hf, convert_to_hf, is_hf_dir, load_hf
from lmforge.interop.llama import load_llama_folder

__all__ = ["convert_from_hf", "convert_to_hf", "is_hf_dir", "load_hf", "load_llama_folder"]
