"""The language-model layer: what policies (`sepo.policies.lm`, which samples and plays) and training (the
SFT and SEPO stages, which score) both do with a causal language model, written once below both.

- `logprobs`: per-token log-probabilities of given tokens with bounded memory, the next-token logits, and the
  position ids of a left-padded batch (the same positions `generate` uses, so a teacher-forced pass scores
  exactly what was sampled).
- `sampling`: pure temperature sampling from per-row counter streams, recording each drawn token's log-prob.
- `decoding`: the text of a growing answer, decoded a token at a time (what the stopping rule reads).
- `batching`: the one padding layout (prompts left-padded, continuations after them), the prefix every row
  shares, the end-of-turn ids.
- `prompt_cache`: prompt tokens encoded once (a shared prefix, each episode's previous prompt) as the KV cache a
  decoding starts from.
- `stopping`: per-row stopping inside one `generate` call, by a rule the caller gives.
- `graph_decoding`: `generate`'s decode steps on a static cache replayed as CUDA graphs (`model.decode_graphs`).
- `gated_delta_decode`: Qwen 3.5's linear-attention decode step in five passes over its state (`model.lean_delta_decode`).

It imports nothing else of the project but its errors and section timers (tests/test_layout.py), so either
side can use it without the other.
"""
