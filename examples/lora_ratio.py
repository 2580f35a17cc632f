"""Seed 000, question 5: how many parameters LoRA fine-tunes, and when to use which strategy.

Exercise (paraphrased). A layer maps W_in = 200 inputs to W_out = 50 outputs; LoRA uses rank R = 5.
What is the ratio of LoRA's fine-tuned parameters to those of full fine-tuning? And which of the
fine-tuning strategies of the seed's figure (missing from the extracted text; we take them to be
full fine-tuning, freezing the pretrained weights and training a small part, and LoRA) suits
(1) the fastest inference, (2) many task variants in little storage, (3) little training memory?

Answer.
- Full fine-tuning updates W (W_out x W_in) = 50 * 200 = 10,000 parameters.
- LoRA freezes W and learns W + B A with B (W_out x R) and A (R x W_in):
  R * (W_in + W_out) = 5 * 250 = 1,250 parameters. Ratio 1,250 / 10,000 = 0.125.
- (1) Fastest inference: full fine-tuning, or LoRA with B A merged into W after training: the
  merged matrix has the original shape, so no extra computation (unmerged adapters add latency).
- (2) Limited storage for many tasks: LoRA (or adapters): store the shared model once plus a small
  B, A per task (here 12.5% of the layer) instead of a full copy of the model per task.
- (3) Limited training memory: LoRA or freezing: gradients and optimizer states exist only for the
  few trainable parameters; the frozen weights need none.
"""

from __future__ import annotations

import numpy as np


def full_parameters(w_in: int, w_out: int) -> int:
    return w_in * w_out


def lora_parameters(w_in: int, w_out: int, rank: int) -> int:
    """B (W_out, R) plus A (R, W_in)."""
    return rank * (w_in + w_out)


def lora_ratio(w_in: int, w_out: int, rank: int) -> float:
    return lora_parameters(w_in, w_out, rank) / full_parameters(w_in, w_out)


def merged_equals_adapter(w_in: int, w_out: int, rank: int, seed: int = 0) -> float:
    """Max |x (W + B A)^T - (x W^T + x A^T B^T)|: merging LoRA adds no inference cost."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(w_out, w_in))  # (W_out, W_in) frozen
    a = rng.normal(size=(rank, w_in))  # (R, W_in)
    b = rng.normal(size=(w_out, rank))  # (W_out, R)
    x = rng.normal(size=(3, w_in))  # (batch, W_in)
    merged = x @ (w + b @ a).T  # (batch, W_out): one matmul, same shape as W
    adapter = x @ w.T + (x @ a.T) @ b.T  # (batch, W_out): two extra small matmuls
    return float(np.abs(merged - adapter).max())


def main() -> None:
    w_in, w_out, rank = 200, 50, 5
    full = full_parameters(w_in, w_out)
    lora = lora_parameters(w_in, w_out, rank)
    print(f"W_in={w_in} W_out={w_out} R={rank}")
    print(f"full fine-tuning: W_in*W_out = {full:,} parameters")
    print(f"LoRA: R*(W_in+W_out) = {rank}*{w_in + w_out} = {lora:,} parameters")
    print(f"ratio LoRA/full = {lora_ratio(w_in, w_out, rank):.3f}")
    diff = merged_equals_adapter(w_in, w_out, rank)
    print(f"merged W + BA gives the adapter's output (max diff {diff:.1e})")
    print("fastest inference: full fine-tuning, or LoRA merged into W (no extra matmuls)")
    print("many tasks, little storage: LoRA/adapters (store only B, A per task)")
    print("little training memory: LoRA or freezing (no gradients/optimizer state for frozen W)")


if __name__ == "__main__":
    main()
