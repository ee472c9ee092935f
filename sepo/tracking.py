"""One experiment-tracking wrapper: W&B (offline by default) or nothing (`logger=none`).

Stages call `tracker.log(metrics, step=...)` and `tracker.summary(...)` without knowing which
backend runs. W&B offline mode writes under the run dir and never touches the network; users
with an account choose `logger.mode=online`.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf


class NullTracker:
    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


#: the default of every stage's `tracker` argument: NullTracker keeps no state, so one instance serves all
NO_TRACKING = NullTracker()


class WandbTracker(NullTracker):
    def __init__(self, cfg: DictConfig):
        import wandb

        lc = cfg.logger
        os.environ.setdefault("WANDB_SILENT", "true")
        tags = [f"game:{cfg.game.name}", f"model:{cfg.model.name}", f"stage:{cfg.stage.name}", *lc.tags]
        self.run = wandb.init(
            project=lc.project,
            entity=lc.entity,
            group=str(lc.group),
            mode=lc.mode,
            name=run_label(cfg),
            tags=tags,
            dir=cfg.paths.output_dir,
            config=OmegaConf.to_container(cfg, resolve=True),
            settings=wandb.Settings(init_timeout=120, silent=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.run.log({**metrics, **({"step": step} if step is not None else {})})

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def run_label(cfg: DictConfig) -> str:
    return f"{cfg.stage.name}-{cfg.game.name}-{cfg.model.name}-s{cfg.seed}"


def start(cfg: DictConfig) -> NullTracker:
    if cfg.logger.name == "none" or cfg.logger.get("mode") == "disabled":
        return NullTracker()
    return WandbTracker(cfg)


def flatten(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}/{k}": v for k, v in values.items() if isinstance(v, (int, float))}
