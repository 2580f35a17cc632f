"""Jobs built from the engine: each composes tokenizers, data, models, train, generation and viz into a run.

    pretrain.py       a YAML recipe → tokenizer → corpus shards → model → trainer → a model directory
                      (or continued pretraining from a checkpoint: model.init_from)
    finetune.py       a labeled task on a pretrained encoder: full | frozen | lora | adapter (finetune_args.py:
                      the settings, no torch; classify.py: evaluation and prediction; self_training.py:
                      pseudo-labels for --unlabeled texts)
    translate.py      translate with an encoder-decoder; BLEU / chrF; cross-attention alignments
    embed.py          sentence embeddings, similar words, analogies
    inspect.py        every layer's and head's attention of a text, and its rollout
    demo.py           the main job on the embedded default (Shakespeare), end to end

The workflows import the engine, never the CLI; the CLI (lmforge.cli) is a thin shell over them.
Importing this package imports nothing: import the workflow you need.
"""
