"""The embedded `tiny` model: a small Qwen3-style causal LM with random weights and a byte-level BPE
trained on the games' own text (`sepo.tiny_corpus`), built offline on a CPU in seconds.

It exercises every stage of the pipeline without a download or a GPU; it is not meant to play well.
It is built once per configuration under `<cache_dir>/tiny-<hash>/` and then loaded exactly like a
real checkpoint (`sepo.models.load_pretrained`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from sepo.builders.cache import cached_build

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Special tokens of the tiny tokenizer (ids 0, 1, 2): Qwen's ChatML set.
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
#: Reasoning markers: ordinary added tokens, as in Qwen, so decoding keeps them.
THINK_TOKENS = ("<think>", "</think>")

#: ChatML, as the Qwen models use it. `enable_thinking=true` opens a <think> block in the generation
#: prompt; false (the default) leaves the model to answer directly.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


#: what to change when a tiny build does not run
TINY_FIX = (
    "allowed: model.architecture and model.tokenizer values a Qwen3 model runs with (every size at least 1, "
    "num_attention_heads a multiple of num_key_value_heads)"
)


def build_tiny(model_cfg: Any, cache_dir: str | Path) -> Path:
    """The directory `<cache_dir>/tiny-<hash>/` of the tiny model and tokenizer, built (deterministic,
    offline, seconds) unless an intact build is there."""
    from sepo.paths import CONF_DIR
    from sepo.tiny_corpus import build_corpus, corpus_digest

    texts = build_corpus(model_cfg.corpus, CONF_DIR)
    digest = corpus_digest(texts)

    def build(tmp: Path) -> dict[str, Any]:
        tokenizer = train_tiny_tokenizer(texts, model_cfg.tokenizer)
        model = init_tiny_model(model_cfg, tokenizer)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        return {
            "config": _tiny_parts(model_cfg),
            "corpus_sha256": digest,
            "corpus_texts": len(texts),
            "tokens": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    out = Path(cache_dir) / f"tiny-{tiny_key(model_cfg, digest)}"
    return cached_build(out, build, "tiny model", TINY_FIX)


def _tiny_parts(model_cfg: Any) -> dict[str, Any]:
    """The config fields that determine the built files (others, e.g. lora or sft, do not)."""
    return {
        key: OmegaConf.to_container(model_cfg[key], resolve=True)
        if OmegaConf.is_config(model_cfg[key])
        else model_cfg[key]
        for key in ("architecture", "tokenizer", "corpus", "seed")
    }


def tiny_key(model_cfg: Any, corpus_digest: str) -> str:
    """Short hash of everything the tiny build depends on: its config, the corpus and the template."""
    payload = json.dumps(
        {
            "cfg": _tiny_parts(model_cfg),
            "corpus": corpus_digest,
            "template": TINY_CHAT_TEMPLATE,
            "special": SPECIAL_TOKENS,
            "think": THINK_TOKENS,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def train_tiny_tokenizer(texts: list[str], tok_cfg: Any):
    """Byte-level BPE on `texts`, wrapped as a fast tokenizer with ChatML and left padding.

    Training stops at `tok_cfg.vocab_size` tokens or earlier, when every word of the corpus is one
    token (the games' text has a small vocabulary).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tok_cfg.vocab_size - len(THINK_TOKENS),
        min_frequency=tok_cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",
        chat_template=TINY_CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
    )


def padded_vocab(tokenizer: Any, multiple: int = 64) -> int:
    """The embedding rows a model built for `tokenizer` gets: its length rounded up, as real vocabularies are."""
    return -(-len(tokenizer) // multiple) * multiple


def init_tiny_model(model_cfg: Any, tokenizer: Any):
    """A randomly initialised Qwen3 causal LM; the global torch RNG is left untouched."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    arch = model_cfg.architecture
    pad, eos = tokenizer.convert_tokens_to_ids(PAD), tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen3Config(
        vocab_size=padded_vocab(tokenizer, arch.pad_vocab_to_multiple_of),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        initializer_range=arch.initializer_range,
        tie_word_embeddings=arch.tie_word_embeddings,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_cfg.seed)
        model = Qwen3ForCausalLM(config)
    # stop at the end of the assistant turn (and at the pad/end-of-text token), like Qwen's instruct models
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=None)
    return model
