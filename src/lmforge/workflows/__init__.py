"""Jobs built from the engine: each composes tokenizers, data, models, train, generation and viz into a run.

    pretrain.py       a YAML recipe → tokenizer → corpus shards → model → trainer → a model directory
                      (or continued pretraining from a checkpoint: model.init_from)
    pretrain_args.py  the recipe's sections (tokenizer, data, model, train), declared once; no torch
    finetune.py       a labeled task on a pretrained encoder: full | frozen | lora | adapter
    finetune_args.py  one fine-tuning run's settings (FinetuneArgs), from flags or a recipe; no torch
    finetune_eval.py  evaluation during fine-tuning, the best checkpoint, early stopping
    classify.py       a trained classifier at work: probabilities, the evaluation report, predictions
    self_training.py  pseudo-labels for --unlabeled texts the classifier is sure about, then retraining
    sft.py            instruction tuning: a decoder fine-tuned on conversations (finetune --task chat)
    chat.py           a conversation with a chat model: its template renders the history, the engine replies
    chat_eval.py      what a chat model can do (evaluate --tasks): multiple choice, exact match, chrF, intervals
    perplexity.py     how well a language model predicts a text: perplexity, bits per character and byte
    translate.py      translate with an encoder-decoder; BLEU / chrF; cross-attention alignments
    embed.py          sentence embeddings, similar words, analogies
    inspect.py        every layer's and head's attention of a text, and its rollout
    convert.py        lmforge convert: Hugging Face, PEFT and GGUF in and out, one output that claims its place
    serving.py        what lmforge serve asks of a model, with no HTTP: the engine's thread, the bounds of work
    options.py        the settings of the commands without a recipe (runtime, input, serve, ...); no torch
    demo.py           the main job on the embedded default (Shakespeare), end to end

The workflows import the engine, never the CLI or the HTTP shell (lmforge.cli, lmforge.serve: thin shells over
them). Importing this package imports nothing: import the workflow you need.
"""
