"""The language-model layer: what policies (`sepo.policies.lm`, which samples and plays) and training (the
SFT and SEPO stages, which score) both do with a causal language model, written once below both.

- `logprobs`: per-token log-probabilities of given tokens with bounded memory, the next-token logits, and the
  position ids of a left-padded batch (the same positions `generate` uses, so a teacher-forced pass scores
  exactly what was sampled).

It imports nothing else of the project (tests/test_layout.py), so either side can use it without the other.
"""
