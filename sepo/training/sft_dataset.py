"""An SFT dataset on disk: written as JSONL with its files' hashes, read back checked line by line, and generated
where a run asks for one that is missing (`ensure_dataset`), from the demonstrators of `sepo.training.sft_data`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo import games
from sepo.errors import ConfigError
from sepo.files import directory_written_atomically, move_aside
from sepo.training.sft_data import SPLITS, generate_dataset, load_game_cfg, model_game_settings

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ files
def to_jsonl(examples: Iterable[dict[str, Any]]) -> bytes:
    """One JSON object per line, keys sorted, UTF-8 as is: the same examples give the same bytes."""
    return "".join(json.dumps(ex, sort_keys=True, ensure_ascii=False) + "\n" for ex in examples).encode("utf-8")


def write_dataset(out_dir: Path, name: str, splits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Write <out_dir>/<name>/{train,valid}.jsonl; return each file's path, size and sha256."""
    files = {}
    for split in SPLITS:
        path = out_dir / name / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = to_jsonl(splits[split])
        path.write_bytes(data)
        files[split] = {
            "path": str(path.relative_to(out_dir)),
            "examples": len(splits[split]),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    return files


# --------------------------------------------------------------------------- reading, checked
#: what `read_examples` asks of every line (what `examples_from_records` writes)
EXAMPLE_FORMAT = 'one JSON object per line, {"messages": [system, user, assistant], "game": ..., ...}'


def example_problem(example: Any) -> str | None:
    """Why a decoded line is not an SFT example, or None."""
    if not isinstance(example, dict):
        return f"a JSON {type(example).__name__}, not an object"
    messages = example.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return 'no "messages" list of at least two turns'
    for turn in messages:
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            return 'a turn of "messages" is not {"role": str, "content": str}'
    if messages[-1]["role"] != "assistant":
        return 'the last turn of "messages" is not the assistant\'s'
    if not isinstance(example.get("game"), str):
        return 'no "game" name'
    return None


def read_examples(path: Path) -> list[dict[str, Any]]:
    """The examples of one JSONL split. A line that is not an example is named by file and line (one
    line of error, not a traceback from deep inside tokenisation); an empty file is an error too."""
    from sepo.errors import InputError

    examples = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    example = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"{path}:{number}: not JSON ({err.msg}); allowed: {EXAMPLE_FORMAT}") from None
                problem = example_problem(example)
                if problem:
                    raise InputError(f"{path}:{number}: {problem}; allowed: {EXAMPLE_FORMAT}")
                examples.append(example)
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason}); allowed: {EXAMPLE_FORMAT}") from None
    if not examples:
        raise InputError(f"{path} holds no examples; allowed: {EXAMPLE_FORMAT}")
    return examples


def manifest_mismatch(ds_dir: Path, files: dict[str, Any]) -> str | None:
    """How the split files of a generated dataset differ from what its manifest recorded (size and
    sha256), or None. A cut or edited file is caught before a single example is read."""
    for record in files.values():
        path = ds_dir / Path(record["path"]).name
        if not path.is_file():
            return f"{path.name} is missing"
        if path.stat().st_size != record["bytes"]:
            return f"{path.name} has {path.stat().st_size} bytes, the manifest says {record['bytes']}"
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            return f"{path.name} differs from the file generated (sha256)"
    return None


def dataset_games(dc: DictConfig, dataset: str) -> list[str]:
    """The games a dataset is built from: `datagen.dataset_games`' entry, or, for a dataset named after a game that
    has none, that game alone (so a new game brings its own data without a datagen entry)."""
    if dataset in dc.dataset_games:
        return list(dc.dataset_games[dataset])
    if dataset in games.names():
        return [dataset]
    raise ConfigError(f"sft.dataset={dataset} is not a datagen dataset; allowed: {', '.join(dataset_names(dc))}")


def dataset_names(dc: DictConfig) -> list[str]:
    """Every dataset a run can name: `datagen.dataset_games`' and each game's own."""
    return [*dc.dataset_games, *(g for g in games.names() if g not in dc.dataset_games)]


def _complete(ds_dir: Path) -> bool:
    return (ds_dir / "train.jsonl").exists() and (ds_dir / "valid.jsonl").exists()


def datagen_settings(dc: DictConfig, dataset: str, model: str | None = None) -> dict[str, Any]:
    """What a generated dataset is made from (the `datagen` node's values for it, and the model's own settings of
    its games, `conf/game/model_game/`, where it has any), as its manifest records them."""
    names = dataset_games(dc, dataset)
    own = {g: settings for g in names if (settings := model_game_settings(g, model))}
    return {
        "dataset": dataset,
        "games": names,
        "seed": dc.seed,
        "valid_fraction": dc.valid_fraction,
        "per_game_cap": dc.per_game_cap.get(dataset),
        "episodes_per_opponent": dc.episodes_per_opponent,
        "num_opponents": dc.num_opponents,
        **({"model": model, "model_game_settings": own} if own else {}),
    }


def dataset_dir(data_dir: Path, settings: dict[str, Any]) -> Path:
    """`<data_dir>/<dataset>`, or `<data_dir>/<dataset>-<model>` for data a model's own game settings shape, so
    that models sharing a cache never share a dataset that differs between them."""
    return data_dir / (f"{settings['dataset']}-{settings['model']}" if "model" in settings else settings["dataset"])


def ensure_dataset(cfg: DictConfig, dataset: str, data_dir: str | Path) -> Path:
    """`<data_dir>/<dataset>/`, generated when missing (atomically: temp dir, then rename).

    Generation uses the shipped game configs (`conf/game/*.yaml`) with the model's own settings of each game
    (`conf/game/model_game/`) merged over them, as every run of that model composes them, so a shared cache never
    holds data shaped by one run's game overrides, and a model whose own settings shape the data has its own
    directory (`dataset_dir`); to train on other data, run `stage=datagen` and point
    `sft.data_dir` at its `out_dir`. Data this stage generated records its datagen settings in
    `<dataset>/manifest.json`; reusing it under other settings (say, a smoke run's few episodes) is
    an error rather than a silent mix-up.
    """
    data_dir = Path(data_dir)
    dc = cfg.datagen
    dataset_games(dc, dataset)  # a dataset no datagen entry or game names is one error line
    written_by_datagen = data_dir / dataset  # `stage=datagen` writes no manifest into it: data the user chose
    if _complete(written_by_datagen) and not (written_by_datagen / "manifest.json").exists():
        return written_by_datagen
    settings = datagen_settings(dc, dataset, cfg.model.name)
    ds_dir = dataset_dir(data_dir, settings)
    if _complete(ds_dir):
        made = ds_dir / "manifest.json"  # written when this stage generated the data
        if not made.exists():
            return ds_dir
        old = json.loads(made.read_text())
        diff = [k for k in settings if old.get(k) != settings[k]]
        if diff:
            raise ConfigError(
                f"sft.data_dir={data_dir} holds a {dataset} dataset generated with other datagen settings "
                f"({', '.join(f'{k}: {old.get(k)!r} there, {settings[k]!r} now' for k in diff)}); set sft.data_dir "
                "to another directory or remove that one"
            )
        damage = manifest_mismatch(ds_dir, old.get("files") or {})
        if damage is None:
            return ds_dir
        # generated here from its settings, so it can be generated again, byte for byte
        log.warning("sft: the cached %s dataset in %s is damaged (%s): generating it again", dataset, ds_dir, damage)
        move_aside(ds_dir, "damaged")
    log.info(
        "sft: dataset %s missing under %s; generating it (games %s, seed %s)",
        dataset,
        data_dir,
        settings["games"],
        dc.seed,
    )
    splits = generate_dataset(
        dataset,
        [load_game_cfg(g, model=settings.get("model")) for g in settings["games"]],
        settings["seed"],
        settings["valid_fraction"],
        settings["per_game_cap"],
        settings["episodes_per_opponent"],
        settings["num_opponents"],
    )
    with directory_written_atomically(ds_dir) as tmp:  # another job that finishes first: its copy is used
        files = write_dataset(tmp.parent, tmp.name, splits)  # writes <tmp.parent>/<tmp.name>/, i.e. tmp itself
        info = {**settings, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return ds_dir


def subsample(examples: list[dict[str, Any]], count: int | None, seed: int, tag: str) -> list[dict[str, Any]]:
    """A seeded subsample of `count` examples in their file order (all of them when count is None)."""
    if count is None or count >= len(examples):
        return examples
    rng = np.random.default_rng([seed, sum(map(ord, tag))])
    keep = np.sort(rng.choice(len(examples), count, replace=False))
    return [examples[i] for i in keep]
