"""The model layer (sepo/models.py): the tiny build, one loading path for every architecture, LoRA targets.

Nothing is downloaded. The real architectures (Gemma 4, Qwen 3.5) are built here as tiny random
models with the tiny tokenizer and a chat template shaped like the real model's, saved like a hub
checkpoint, and loaded through `load_model_and_tokenizer` with the real configs and `model.path`
pointing at them.
"""

from __future__ import annotations

import re

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from sepo.builders import load_model_and_tokenizer
from sepo.builders.tiny import IM_END, PAD, build_tiny
from sepo.errors import ConfigError
from sepo.games import make_game, names
from sepo.models import ModelLoadError, chat_template_kwargs, forward_extras, render_chat

from .conftest import CONF, model_cfg

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("offline")]

GENERATION_HEADER = {
    "tiny": "<|im_start|>assistant\n",
    "gemma4": "<|turn>model\n",
    "qwen": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
}
LANGUAGE_LINEAR = re.compile(r"model\.(language_model\.)?layers\.\d+\.")


def game_messages(game: str = "ipd", decisions: int = 3) -> list[dict[str, str]]:
    """The agent's prompt after `decisions` rounds of first-legal-action play."""
    g = make_game(OmegaConf.load(CONF / "game" / f"{game}.yaml"))
    state = g.reset(7)
    messages = g.render_prompt(state, 0)
    while not g.is_over(state) and decisions > 0:
        movers = g.to_act(state)
        if 0 in movers:
            messages, decisions = g.render_prompt(state, 0), decisions - 1
        g.step(state, {p: g.legal_actions(state, p)[0] for p in movers})
    return messages


def load_arch(name: str, dirs: dict):
    return load_model_and_tokenizer(model_cfg(name, path=str(dirs[name])), cache_dir=dirs[name], device="cpu")


# --------------------------------------------------------------------------- the tiny build
def test_tiny_build_is_deterministic_and_cached(tmp_path, tiny_dir):
    cfg = model_cfg("tiny")
    again = build_tiny(cfg, tmp_path / "other")
    assert again.name == tiny_dir.name  # same config and corpus -> same cache key
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    stamp = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny(cfg, tmp_path / "other") == again  # reused, not rebuilt
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert build_tiny(model_cfg("tiny", seed=1), tmp_path / "other") != again  # a build setting changes the key


def test_tiny_size_tokens_and_generation_config(tiny):
    model, tok, _ = tiny
    n = sum(p.numel() for p in model.parameters())
    assert 2e5 <= n <= 5e6, n
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    assert tok.padding_side == "left"
    assert tok.pad_token == PAD
    assert tok.eos_token == IM_END
    for special in ("<|im_start|>", IM_END, PAD, "<think>", "</think>"):
        assert len(tok(special)["input_ids"]) == 1, special
    assert "<think>" in tok.decode(tok("<think>x</think>")["input_ids"], skip_special_tokens=True)
    assert len(tok) <= model.config.vocab_size
    gen = model.generation_config
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    assert tok.convert_tokens_to_ids(IM_END) in eos
    assert gen.pad_token_id == tok.pad_token_id


def test_tiny_default_path_builds_into_cache_dir(tmp_path, tiny_dir):
    model, tok = load_model_and_tokenizer(model_cfg("tiny"), cache_dir=tmp_path, device="cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", tiny_dir.name]  # the build and its lock
    assert tok.chat_template


def test_tiny_chat_template_renders_game_prompts(tiny):
    _, tok, _ = tiny
    cfg = model_cfg("tiny")
    for game in names():
        messages = game_messages(game, decisions=99)  # the longest prompt: the last decision
        text = render_chat(tok, cfg, messages)
        assert text.startswith("<|im_start|>system\n" + messages[0]["content"])
        assert messages[1]["content"] + "<|im_end|>\n" in text
        assert text.endswith(GENERATION_HEADER["tiny"])
        # docs/spec.md §4: SFT examples are cut at 512 tokens; the prompt must leave room for an answer
        assert len(tok(text)["input_ids"]) < 480, game
    no_header = render_chat(tok, cfg, game_messages(), add_generation_prompt=False)
    assert no_header.endswith("<|im_end|>\n")
    thinking = render_chat(tok, model_cfg("tiny", thinking=True), game_messages())
    assert thinking.endswith("<|im_start|>assistant\n<think>\n")
    enc = tok.apply_chat_template(
        game_messages(), add_generation_prompt=True, tokenize=True, return_tensors="pt", **chat_template_kwargs(cfg)
    )
    assert enc["input_ids"].shape[0] == 1
    assert tok.decode(enc["input_ids"][0]).endswith(GENERATION_HEADER["tiny"])


def test_tiny_batched_generation_with_left_padding(tiny):
    model, tok, _ = tiny
    cfg = model_cfg("tiny")
    texts = [render_chat(tok, cfg, game_messages(decisions=d)) for d in (0, 5)]
    batch = tok(texts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"][:, -1] == 1).all()  # left padding: every row ends with a real token
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    width = batch["input_ids"].shape[1]
    assert out.shape[0] == 2
    assert width < out.shape[1] <= width + 4
    assert torch.equal(out[:, :width], batch["input_ids"])


# --------------------------------------------------------------------------- real architectures, tiny weights
@pytest.mark.parametrize("name,cls", [("gemma4", "Gemma4ForConditionalGeneration"), ("qwen", "Qwen3_5ForCausalLM")])
def test_real_architecture_loads_renders_and_generates(name, cls, arch_dirs, tmp_path):
    model, tok = load_arch(name, arch_dirs)
    cfg = model_cfg(name, path=str(arch_dirs[name]))
    assert type(model).__name__ == cls
    assert model.dtype == torch.bfloat16
    assert tok.padding_side == "left"
    assert tok.pad_token is not None

    text = render_chat(tok, cfg, game_messages())
    assert text.endswith(GENERATION_HEADER[name])
    batch = tok([text, render_chat(tok, cfg, game_messages(decisions=0))], return_tensors="pt", padding=True)
    extras = forward_extras(model, cfg, batch["input_ids"])
    if name == "gemma4":  # every token is text: all-zero token types under transformers 5's name
        assert set(extras) == {"mm_token_type_ids"}
        assert not extras["mm_token_type_ids"].any()
    else:
        assert extras == {}
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], **extras}
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[:2] == batch["input_ids"].shape
    assert torch.isfinite(logits.float()).all()
    out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2
    assert out.shape[1] <= batch["input_ids"].shape[1] + 3

    # a merged SFT model is saved with save_pretrained and read back through the same path
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_model_and_tokenizer(model_cfg(name, path=str(tmp_path)), cache_dir=tmp_path, device="cpu")
    assert type(again).__name__ == cls
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, logits)


def test_thinking_switch_reaches_the_real_templates(arch_dirs):
    _, tok = load_arch("qwen", arch_dirs)
    text = render_chat(tok, model_cfg("qwen", thinking=True), game_messages())
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    _, tok = load_arch("gemma4", arch_dirs)
    assert "<|think|>" in render_chat(tok, model_cfg("gemma4", thinking=True), game_messages())
    assert "<|think|>" not in render_chat(tok, model_cfg("gemma4"), game_messages())


@pytest.mark.parametrize("name", ["tiny", "gemma4", "qwen"])
def test_lora_targets_only_language_model_projections(name, arch_dirs):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    model, _ = load_arch(name, arch_dirs)
    regex = model_cfg(name).lora.target_modules
    clippable = {n for n, m in model.named_modules() if type(m).__name__ == "Gemma4ClippableLinear"}
    if name == "gemma4":
        assert any("vision" in n for n in clippable)
        assert any("audio" in n for n in clippable)
    expected = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and re.fullmatch(regex, n)}
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=regex))
    adapted = {n.removeprefix("base_model.model.") for n, m in peft_model.named_modules() if isinstance(m, LoraLayer)}

    assert adapted == expected
    assert adapted
    for n in adapted:
        assert LANGUAGE_LINEAR.match(n), n
        assert not any(word in n for word in ("vision", "visual", "audio", "mlp")), n
        assert not any(n == c or n.startswith(c + ".") for c in clippable), n
    kinds = {n.rsplit(".", 1)[-1] for n in adapted}
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= kinds
    if name == "qwen":  # the linear-attention layers are adapted too
        assert {"in_proj_qkv", "out_proj"} <= kinds


# --------------------------------------------------------------------------- errors
def test_missing_hub_model_says_to_download_and_set_path(tmp_path):
    cfg = model_cfg("qwen", path="sepo-test/no-such-model")
    with pytest.raises(ModelLoadError, match=r"model\.path=/local/dir") as err:
        load_model_and_tokenizer(cfg, cache_dir=tmp_path, device="cpu")
    assert isinstance(err.value, ConfigError)
    assert "sepo-test/no-such-model" in str(err.value)
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_model_and_tokenizer(model_cfg("gemma4", path=str(tmp_path / "nowhere")), cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match=r"model\.path is not set"):
        load_model_and_tokenizer(model_cfg("gemma4", path=None), cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="model.model_class"):
        load_model_and_tokenizer(model_cfg("gemma4", model_class="NoSuchModel"), cache_dir=tmp_path)


def test_config_validation_requires_a_model_path(compose_cfg):
    from sepo.run.config import validate

    validate(compose_cfg("model=tiny"))
    validate(compose_cfg("model=qwen", "model.download=true"))  # fetched when the run loads it
    with pytest.raises(ConfigError, match=r"model\.path"):
        validate(compose_cfg("model=gemma4", "model.path=null"))
