"""Stage `datagen`: write the SFT datasets (`sepo.training.sft_data` builds them) and a manifest.

`<datagen.out_dir>/<dataset>/{train,valid}.jsonl` plus `manifest.json` (sizes, sha256 of every
file, per-game timing, the demonstrator mixture actually drawn). Must not import torch.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sepo.errors import ConfigError
from sepo.tracking import NO_TRACKING, NullTracker
from sepo.training.sft_data import (
    SPLITS,
    build_dataset,
    datagen_opponents,
    demonstrator_weights,
    generate_game_examples,
    load_game_cfg,
)
from sepo.training.sft_dataset import dataset_games, dataset_names, write_dataset

log = logging.getLogger(__name__)


def counts(examples: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{game: {strategy: examples}}, sorted for a stable manifest."""
    c = Counter((ex["game"], ex["strategy"]) for ex in examples)
    out: dict[str, dict[str, int]] = {}
    for (game, strategy), n in sorted(c.items()):
        out.setdefault(game, {})[strategy] = n
    return out


def episode_strategies(examples: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Episodes per demonstrator (each episode counted once), for the mixture check."""
    episodes = {(ex["opponent"], ex["episode"]): ex["strategy"] for ex in examples}
    return dict(sorted(Counter(episodes.values()).items()))


# ------------------------------------------------------------------------------ the stage
def run_datagen(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    """Write every dataset of `datagen.datasets` and `<out_dir>/manifest.json`."""
    dc = cfg.datagen
    unknown = [d for d in dc.datasets if d not in dataset_names(dc)]
    if unknown:
        raise ConfigError(f"datagen.datasets: unknown dataset(s) {unknown}; allowed: {', '.join(dataset_names(dc))}")
    started = time.perf_counter()
    game_examples, game_info = play_every_game(cfg)
    generated = time.perf_counter() - started
    datasets = write_datasets(dc, game_examples)
    manifest = write_manifest(dc, datasets, game_info, generated, time.perf_counter() - started)
    summary = {f"datagen/{d}_{s}": info["files"][s]["examples"] for d, info in datasets.items() for s in SPLITS}
    summary["datagen/examples_per_second"] = manifest["timing"]["examples_per_second"]
    tracker.summary(summary)
    return manifest


def play_every_game(cfg: DictConfig) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The demonstrators' examples of every game some dataset uses (each game played once), and what was played."""
    dc = cfg.datagen
    game_examples: dict[str, list[dict[str, Any]]] = {}
    game_info: dict[str, dict[str, Any]] = {}
    for dataset in dc.datasets:
        for game in dataset_games(dc, dataset):
            if game in game_examples:
                continue
            game_cfg = load_game_cfg(game, cfg.game, cfg.model.name)
            t0 = time.perf_counter()
            examples = generate_game_examples(game_cfg, dc.seed, dc.episodes_per_opponent, dc.num_opponents)
            seconds = time.perf_counter() - t0
            game_examples[game] = examples
            episodes = dc.episodes_per_opponent or game_cfg.datagen.episodes_per_opponent
            opponents = datagen_opponents(game_cfg, dc.num_opponents)
            game_info[game] = {
                "episodes_per_opponent": episodes,
                "opponents": opponents,
                "episodes": episodes * len(opponents),
                "examples": len(examples),
                "demonstrators": demonstrator_weights(game_cfg),
                "episodes_by_strategy": episode_strategies(examples),
                "seconds": round(seconds, 3),
            }
            log.info(
                "datagen %s: %d examples from %d episodes in %.2fs",
                game,
                len(examples),
                episodes * len(opponents),
                seconds,
            )
    return game_examples, game_info


def write_datasets(dc: DictConfig, game_examples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each dataset split and written under `datagen.out_dir`; what each holds."""
    out_dir = Path(dc.out_dir)
    caps = dc.per_game_cap
    datasets: dict[str, Any] = {}
    for dataset in dc.datasets:
        games = dataset_games(dc, dataset)
        splits = build_dataset(
            dataset, {g: game_examples[g] for g in games}, dc.seed, dc.valid_fraction, caps.get(dataset)
        )
        files = write_dataset(out_dir, dataset, splits)
        datasets[dataset] = {
            "games": games,
            "per_game_cap": caps.get(dataset),
            "examples": sum(len(s) for s in splits.values()),
            "files": files,
            "counts": {split: counts(splits[split]) for split in SPLITS},
        }
        log.info(
            "datagen %s: train %d, valid %d -> %s",
            dataset,
            files["train"]["examples"],
            files["valid"]["examples"],
            out_dir / dataset,
        )
    return datasets


def write_manifest(
    dc: DictConfig,
    datasets: dict[str, Any],
    game_info: dict[str, dict[str, Any]],
    generated: float,
    total: float,
) -> dict[str, Any]:
    """`<out_dir>/manifest.json`: the datasets, the games played and the timing."""
    out_dir = Path(dc.out_dir)
    n_generated = sum(info["examples"] for info in game_info.values())
    manifest = {
        "seed": dc.seed,
        "valid_fraction": dc.valid_fraction,
        "split": "example-level: seeded shuffle of each dataset, the last round(N * valid_fraction) are valid",
        "notes": [
            "sizes follow the paper's per-game generation table (multi = 3 x multi_per_game = 24,000 by default); "
            "its dataset table's 31,988 for multi is neither 3 x 8,000 nor balanced",
            "kuhn: one example per agent decision, 1 or 2 per hand, so its size follows from the hands played",
        ],
        "datasets": datasets,
        "games": game_info,
        "timing": {
            "generated_examples": n_generated,
            "generation_seconds": round(generated, 3),
            "total_seconds": round(total, 3),
            "examples_per_second": round(n_generated / generated, 1) if generated > 0 else None,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    log.info(
        "datagen: %d examples generated in %.2fs (%.0f examples/s); all files written in %.2fs",
        n_generated,
        generated,
        manifest["timing"]["examples_per_second"] or 0,
        total,
    )
    return manifest
