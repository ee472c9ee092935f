"""Stage `eval`: play the agent against every pool of the game and write results.json.

Each distinct opponent of all pools is played once (`eval.episodes_per_opponent` episodes, all in
lockstep); pools that share a strategy share its episodes. The results file follows docs/design.md:
`{game, model, stage, checkpoint, step, seed, lambdas, metrics, se, per_opponent, episodes}`,
plus `per_episode` (every episode's totals and actions round by round) so numbers can be re-derived later.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from sepo.arena import EpisodeRecord, play
from sepo.errors import ConfigError
from sepo.files import write_text_atomically
from sepo.games import Game, make_game
from sepo.games.strategy import make_strategy
from sepo.metrics import POOLS, compute_metrics, pools_of
from sepo.policies import Policy, ScriptedPolicy
from sepo.policies.played_table import played_table, reads_a_table
from sepo.tracking import NO_TRACKING, NullTracker, flatten

log = logging.getLogger(__name__)


def progress_bars(first_pool: dict[str, str], episodes: int, progress: bool) -> dict[str, Any]:
    """One bar per pool over the episodes of the opponents it is the first pool of (each opponent plays once)."""
    return {
        pool: tqdm(
            total=episodes * sum(1 for p in first_pool.values() if p == pool),
            desc=f"eval {pool}",
            unit="ep",
            disable=not progress,
            leave=False,
        )
        for pool in POOLS
        if pool in first_pool.values()
    }


def episode_record(r: EpisodeRecord) -> dict[str, Any]:
    """One episode as results.json's `per_episode` keeps it."""
    return {
        "opponent": r.opponent,
        "index": r.index,
        "seed": r.seed,
        "mirror": r.mirror,
        "agent_total": r.agent_total,
        "opp_total": r.opp_total,
        "rounds": len(r.rounds),
        "decisions": r.decisions,
        "parsed": r.parsed,
        # [agent, opponent] per round (Kuhn: each seat's actions in the hand), so behaviour can be
        # read round by round later (e.g. in which round an agent defects on AlwaysC)
        "actions": [list(played.actions) for played in r.rounds],
    }


def evaluate_policy(
    game: Game,
    policy: Policy,
    pools: dict[str, list[str]],
    lambdas: dict[str, float],
    episodes: int,
    seed: int,
    mirrored: bool = False,
    progress: bool = True,
    table: Any = None,
) -> dict[str, Any]:
    """Metrics of `policy` on `game` against `pools` (no file I/O).

    Where the game has an exact analysis (Kuhn poker), the policy's played table is estimated first
    (seeded by `seed`, so every checkpoint of a run is read on the same sampling streams), unless the
    caller read it already (`table`, `played_table_of` with the same seed): it gives `exploit_exact`
    with its SE, and it is what a `BestResponse` opponent responds to.
    """
    names = list(dict.fromkeys(n for pool in POOLS for n in pools[pool]))
    opponents = {n: make_strategy(game.cfg, n, key="game.pools") for n in names}
    table = played_table_of(game, policy, seed) if table is None else table
    respond_to_agent(opponents.values(), table)
    first_pool = {}
    for pool in POOLS:
        for n in pools[pool]:
            first_pool.setdefault(n, pool)

    bars = progress_bars(first_pool, episodes, progress)

    def done(record: EpisodeRecord) -> None:
        bars[first_pool[record.opponent]].update(1)

    workers = int(getattr(policy, "workers", 1))  # forked processes sharing the episodes (a language model on a CPU)
    records = play(game, policy, opponents, episodes, seed, mirrored=mirrored, on_episode_done=done, workers=workers)
    for bar in bars.values():
        bar.close()
    by_opponent: dict[str, list[EpisodeRecord]] = {n: [] for n in names}
    for r in records:
        by_opponent[r.opponent].append(r)

    result = compute_metrics(game, pools, by_opponent, lambdas)
    if table is not None:
        result["metrics"]["exploit_exact"] = table.exploitability
        result["se"]["exploit_exact"] = table.exploitability_se
        result["played_table"] = {**table.to_json(), **read_settings(policy)}
    result["episodes"] = len(records)
    result["per_episode"] = [episode_record(r) for r in records]
    return result


def played_table_of(game: Game, policy: Policy, seed: int) -> Any:
    """The policy's played table where the game can analyse one exactly (Kuhn poker), else None."""
    if reads_a_table(game) and hasattr(policy, "action_probabilities"):
        return played_table(game, policy, seed=seed)
    return None


def read_settings(policy: Policy) -> dict[str, Any]:
    """How a language model's table was read, beside the answers a state (`samples_per_state`): what
    decides whether another run may answer the same read (`sepo.training.best_response.BestResponseSchedule.answer_sft_read`)."""
    if not hasattr(policy, "max_new_tokens"):
        return {}
    return {"temperature": float(policy.temperature), "max_new_tokens": int(policy.max_new_tokens)}


def respond_to_agent(strategies: Any, table: Any) -> None:
    """Hand the agent's played table to every opponent that responds to it (`BestResponse`)."""
    for strategy in strategies:
        if getattr(strategy, "responds_to_agent", False):
            if table is None:
                raise ConfigError(
                    f"game.pools: {strategy.name} responds to the agent's played table, which this "
                    "game or agent cannot give; allowed: Kuhn poker with a language model or a "
                    "scripted agent whose strategy defines its probabilities"
                )
            strategy.respond_to(table.table)


def build_policy(cfg: DictConfig, game: Game) -> Policy:
    """The agent of `cfg.model`: a scripted strategy, or a language model loaded from `model.path`.

    Language-model imports stay inside this function so scripted runs never load torch.
    """
    if cfg.model.name == "scripted":
        name = cfg.model.strategy or cfg.game.reference_strategy
        return ScriptedPolicy(make_strategy(cfg.game, name, key="model.strategy"))
    from sepo.builders import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    return evaluation_policy(cfg, model, tokenizer)


def evaluation_policy(
    cfg: DictConfig, model: Any, tokenizer: Any, model_cfg: DictConfig | None = None, generation_seed: int | None = None
) -> Policy:
    """A language model as every evaluation plays it (the `eval` settings), whichever stage evaluates:
    stage eval, the pipeline's Base, the SFT stage's merged model, each SEPO checkpoint.

    `model_cfg`: the model's settings when they are not `cfg.model` (SFT's merged copy);
    `generation_seed`: the sampling seed when it is not `generation_seed` (validation episodes).
    """
    from sepo.policies.lm import LMPolicy

    return LMPolicy(
        model,
        tokenizer,
        cfg.model if model_cfg is None else model_cfg,
        temperature=cfg.eval.temperature,
        max_new_tokens=cfg.eval.max_new_tokens,
        seed=cfg.generation_seed if generation_seed is None else generation_seed,
        batch_size=cfg.eval.batch_size,
        action_samples=cfg.eval.action_samples,
    )


def evaluate_and_write(
    cfg: DictConfig,
    game: Game,
    policy: Policy,
    path: Path,
    stage: str,
    checkpoint: str | None = None,
    step: int | None = None,
    split: str = "test",
    table: Any = None,
) -> dict[str, Any]:
    """Evaluate `policy` with the run's protocol (`evaluate_with_protocol`) and write its results.json at
    `path`; returns the payload."""
    result = evaluate_with_protocol(cfg, game, policy, split, table)
    return write_results(path, cfg, result, stage=stage, checkpoint=checkpoint, step=step, split=split)


def evaluate_with_protocol(
    cfg: DictConfig, game: Game, policy: Policy, split: str = "test", table: Any = None
) -> dict[str, Any]:
    """`evaluate_policy` with the run's protocol: every pool, `eval.episodes_per_opponent` episodes of the
    split's seed (`split_seed`), the evaluation lambdas; `table`: the policy's played table, when read already."""
    return evaluate_policy(
        game,
        policy,
        pools_of(cfg.game),
        dict(cfg.lambdas.eval),
        cfg.eval.episodes_per_opponent,
        split_seed(cfg, split),
        mirrored=cfg.game.mirrored,
        progress=cfg.eval.progress,
        table=table,
    )


def split_seed(cfg: DictConfig, split: str) -> int:
    """The seed of a split's episodes and of its read of the played table: test `seed`, validation
    `eval.validation_seed`."""
    return cfg.seed if split == "test" else cfg.eval.validation_seed


def write_results(
    path: Path,
    cfg: DictConfig,
    result: dict[str, Any],
    stage: str,
    checkpoint: str | None = None,
    step: int | None = None,
    split: str = "test",
) -> dict[str, Any]:
    """`split`: test (the episodes of `seed`, which the tables report) or validation (`eval.validation_seed`)."""
    payload = {
        "game": cfg.game.name,
        "model": cfg.model.name
        if cfg.model.name != "scripted"
        else f"scripted:{cfg.model.strategy or cfg.game.reference_strategy}",
        "stage": stage,
        "checkpoint": checkpoint,
        "step": step,
        "split": split,
        "seed": split_seed(cfg, split),
        "train_seed": train_seed(cfg, stage),
        "lambdas": OmegaConf.to_container(cfg.lambdas.eval, resolve=True),
        "lambdas_train": OmegaConf.to_container(cfg.lambdas.train, resolve=True),  # all 0: a payoff-only run
        **result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(payload, indent=2) + "\n")  # a kill never leaves half a results.json
    return payload


def train_seed(cfg: DictConfig, stage: str) -> int | None:
    """The training run's own seed (`sft.seed`, `sepo.seed`): runs of a sweep over it differ only there."""
    return cfg[stage].seed if stage in ("sft", "sepo") else None


def run_eval(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    game = make_game(cfg.game)
    as_sft = cfg.eval.phase == "sft"  # an SFT checkpoint evaluated on its own: the SFT row of the tables
    payload = evaluate_and_write(
        cfg,
        game,
        build_policy(cfg, game),
        Path(cfg.paths.output_dir) / "results.json",
        stage="sft" if as_sft else "eval",
        checkpoint="final" if as_sft else None,
    )
    tracker.log({**flatten("eval", payload["metrics"]), **flatten("eval_se", payload["se"])}, step=0)
    tracker.summary(flatten("eval", payload["metrics"]))
    m, se = payload["metrics"], payload["se"]
    log.info("%s", "  ".join(f"{k}={m[k]:.4f}±{se[k]:.4f}" for k in m))
    return payload


def evaluate_checkpoint(
    cfg: DictConfig, game: Game, model: Any, tokenizer: Any, step: int, final: bool
) -> tuple[dict, Any]:
    """The checkpoint on the validation episodes (`eval.validation_seed`: validation.json, what picks the
    best checkpoint) and on the test episodes (`seed`: results.json, what the tables report); returns the
    test payload and the test read of the played table (None where the game has none)."""
    out = Path(cfg.paths.output_dir) / "eval" / f"step_{step}"
    checkpoint = "final" if final else f"step_{step}"
    for split, name in (("validation", "validation.json"), ("test", "results.json")):
        # validation episodes are sampled from their own stream too, so nothing of them leaks into the test's
        seed = split_seed(cfg, split)
        policy = evaluation_policy(cfg, model, tokenizer, generation_seed=None if split == "test" else seed)
        table = played_table_of(game, policy, seed)
        payload = evaluate_and_write(cfg, game, policy, out / name, "sepo", checkpoint, step, split, table)
    return payload, table
