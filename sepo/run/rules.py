"""The rules table: every config field a run reads with a constrained value, its allowed values, and where it
matters (every run, some stages, or a condition on the config). `sepo.run.config` applies it before any work;
the penalty terms' rows are built from the terms registered when it is asked (`rules()`).
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from sepo import games, penalties
from sepo.config_rules import (
    Rule,
    boolean,
    distinct_names_of,
    even_integer,
    integer,
    mapping,
    named_integers,
    named_lists,
    names_of,
    non_empty_name,
    one_of,
    optional_integers_of,
    optional_name,
    probability,
    real,
    regex,
    step_list,
    steps_or_share,
    strings,
    temperature,
)
from sepo.errors import ConfigError
from sepo.paths import CONF_DIR
from sepo.training.options import (
    ADV_NORMS,
    CREDITS,
    ESTIMATORS,
    LENGTH_NORMS,
    LR_SCHEDULES,
    PENALTY_MODES,
)

#: the models a run can name: one per conf/model/<model>.yaml (a new model is its YAML)
MODEL_KINDS = tuple(sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
#: models built by the code itself; every other language model is loaded from `model.path`
BUILT_MODELS = ("scripted", "tiny", "smollm2")
#: stages that train the model (a scripted agent has nothing to train)
TRAINING_STAGES = ("sft", "sepo", "pipeline")
TORCH_DTYPES = ("auto", "bfloat16_if_fast", "float32", "bfloat16", "float16", "float64")
LOGGER_MODES = ("offline", "online", "disabled")
#: transformers' learning-rate schedules that need no settings beyond the warm-up (`sft.lr_scheduler`)
SFT_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)


# ------------------------------------------------------------------------------ the rules
def _language_model(cfg: DictConfig) -> bool:
    return cfg.model.name != "scripted"


def _wandb(cfg: DictConfig) -> bool:
    return cfg.logger.get("name") == "wandb"


def _model(name: str) -> Callable[[DictConfig], bool]:
    return lambda cfg: cfg.model.name == name


def _game(name: str) -> Callable[[DictConfig], bool]:
    return lambda cfg: cfg.game.name == name


#: a language model's switches (conf/model/<model>.yaml says what each does); a key a model's YAML lacks
#: is not checked (the code reads it with its default)
MODEL_FLAGS = (
    "trust_remote_code",
    "download",
    "token_type_ids",
    "thinking",
    "prefix_cache",
    "prefix_tree",
    "static_cache",
    "decode_graphs",
    "cascade_attention",
    "packed_linears",
    "lean_delta_decode",
)
#: the tiny model's architecture sizes that must be positive integers (head_dim has its own rule: RoPE halves it)
TINY_SIZES = (
    "pad_vocab_to_multiple_of",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
#: the smallest vocabulary tiny's byte-level BPE can have: its 256 byte tokens and its special and think tokens
TINY_MIN_VOCAB = 256 + 5


SEED = integer(0, 2**32)  # numpy's seeds
EVAL, DATA, SFT, SEPO = "eval sft sepo pipeline", "datagen sft pipeline", "sft pipeline", "sepo pipeline"
#: (where the key matters: "all", the stages, or a condition on the config; key; rule). Checked before any work.
RULES: list[tuple[str | Callable[[DictConfig], bool], str, Rule]] = [
    ("all", "seed", SEED),
    ("all", "generation_seed", SEED),
    ("all", "resume", one_of("auto", "never")),
    ("all", "game.rounds", integer(1)),
    ("all", "game.max_payoff", real(0.0, strict=True)),
    ("all", "eval.phase", one_of(None, "sft")),
    ("all", "datagen.valid_fraction", real(0.0, strict=True, high=1.0)),
    # ---- the game (each game's own keys: `game_rules`)
    ("all", "game.sft_dataset", non_empty_name()),
    ("all", "game.mirrored", boolean()),
    ("all", "game.datagen.episodes_per_opponent", integer(1)),
    # ---- the model
    (_language_model, "model.dtype", one_of(*TORCH_DTYPES)),
    (_language_model, "model.model_class", non_empty_name()),
    (_language_model, "model.revision", optional_name("the default branch")),
    *[(_language_model, f"model.{flag}", boolean()) for flag in MODEL_FLAGS],
    (_language_model, "model.chat_template_kwargs", mapping()),
    (_language_model, "model.drop_stopped_rows", probability()),
    (
        _language_model,
        "model.cpu_workers",
        integer(1, why="the processes evaluations and rollouts are split over on a CPU"),
    ),
    (_language_model, "model.lora.target_modules", regex(optional=True)),
    (_model("tiny"), "model.seed", SEED),
    *[(_model("tiny"), f"model.architecture.{k}", integer(1)) for k in TINY_SIZES],
    (_model("tiny"), "model.architecture.head_dim", even_integer(2)),
    (_model("tiny"), "model.architecture.max_position_embeddings", integer(2)),
    (_model("tiny"), "model.architecture.rope_theta", real(0.0, strict=True)),
    (_model("tiny"), "model.architecture.initializer_range", real(0.0, strict=True)),
    (_model("tiny"), "model.architecture.tie_word_embeddings", boolean()),
    (_model("tiny"), "model.tokenizer.vocab_size", integer(TINY_MIN_VOCAB, why="256 byte tokens and 5 special ones")),
    (_model("tiny"), "model.tokenizer.min_frequency", integer(1)),
    (_model("tiny"), "model.corpus.games", names_of(games.names(), "games")),
    (_model("tiny"), "model.corpus.seed", SEED),
    (_model("tiny"), "model.corpus.episodes_per_opponent", integer(1)),
    (_wandb, "logger.mode", one_of(*LOGGER_MODES)),
    (_wandb, "logger.project", non_empty_name()),
    (_wandb, "logger.group", non_empty_name()),
    (_wandb, "logger.entity", optional_name("your default")),
    (_wandb, "logger.tags", strings()),
    (EVAL, "eval.episodes_per_opponent", integer(1)),
    (EVAL, "eval.temperature", temperature(greedy=True)),
    (EVAL, "eval.episode_memory_kb", real(0.0, strict=True)),
    (EVAL, "eval.max_new_tokens", integer(1)),
    (EVAL, "eval.batch_size", integer(0)),
    (EVAL, "eval.action_samples", integer(2)),
    (EVAL, "eval.progress", boolean()),
    (SEPO, "eval.validation_seed", SEED),
    (DATA, "datagen.seed", SEED),
    (DATA, "datagen.num_opponents", integer(1)),
    (DATA, "datagen.multi_per_game", integer(1)),
    (DATA, "datagen.episodes_per_opponent", integer(1, optional=True)),
    (DATA, "datagen.datasets", strings()),  # each one a key of datagen.dataset_games (checked when building)
    (DATA, "datagen.multi_games", names_of(games.names(), "games")),
    (DATA, "datagen.dataset_games", named_lists(games.names(), "games")),
    (DATA, "datagen.per_game_cap", named_integers(1)),
    (
        SFT,
        "sft.dataset",
        Rule(lambda v: isinstance(v, str) and v != "", "a dataset name (game.sft_dataset names each game's)"),
    ),
    (SFT, "sft.lr", real(0.0, strict=True)),
    (SFT, "sft.epochs", real(0.0, strict=True)),
    (SFT, "sft.max_steps", integer(1, optional=True)),
    (SFT, "sft.max_examples", integer(1, optional=True)),
    (SFT, "sft.max_valid_examples", integer(1, optional=True)),
    (SFT, "sft.per_device_batch_size", integer(1)),
    (SFT, "sft.grad_accum", integer(1)),
    (SFT, "sft.max_length", integer(1)),
    (SFT, "sft.eval_steps", integer(1)),
    (SFT, "sft.logging_steps", integer(1)),
    (SFT, "sft.save_steps", steps_or_share()),
    (SFT, "sft.warmup_ratio", real(0.0, high=1.0)),
    (SFT, "sft.eval_batch_size", integer(1)),
    (SFT, "sft.agreement_examples", integer(0)),
    (SFT, "sft.agreement_batch_size", integer(1)),
    (SFT, "sft.agreement_max_new_tokens", integer(1)),
    (SFT, "sft.prefix_min_tokens", integer(1)),
    (SFT, "sft.pass_cost", real(0.0)),
    (SFT, "sft.weight_decay", real(0.0)),
    (SFT, "sft.max_grad_norm", real(0.0, strict=True)),
    (SFT, "sft.lora.r", integer(1)),
    (SFT, "sft.lora.dropout", real(0.0, high=1.0)),
    (SFT, "sft.seed", SEED),
    (SFT, "sft.adam_beta1", real(0.0, high=1.0)),
    (SFT, "sft.adam_beta2", real(0.0, high=1.0)),
    (SFT, "sft.lora.alpha", real(0.0, strict=True)),
    (SFT, "sft.lora.target_modules", optional_name("the model's model.lora.target_modules")),
    (SFT, "sft.lr_scheduler", one_of(*SFT_SCHEDULERS)),
    (SFT, "sft.save_total_limit", integer(1, optional=True)),
    *[
        (SFT, f"sft.{flag}", boolean())
        for flag in (
            "answer_logits_only",
            "assistant_only_loss",
            "bf16",
            "evaluate",
            "full_finetune",
            "gradient_checkpointing",
            "prefix_sharing",
        )
    ],
    (SEPO, "sepo.steps", integer(1)),
    (SEPO, "sepo.estimator", one_of(*ESTIMATORS)),
    (SEPO, "sepo.infoset_samples", integer(2, why="the leave-one-out baseline compares each answer with the others")),
    (SEPO, "sepo.responder_table_decay", real(0.0, high=1.0, high_closed=True)),
    (SEPO, "sepo.penalty_mode", one_of(*PENALTY_MODES)),
    (SEPO, "sepo.credit", one_of(*CREDITS)),
    (SEPO, "sepo.adv_norm", one_of(*ADV_NORMS)),
    (SEPO, "sepo.length_norm", one_of(*LENGTH_NORMS)),
    (SEPO, "sepo.adv_scale_decay", real(0.0, high=1.0)),
    (SEPO, "sepo.exploit_switch_episodes", integer(1)),
    (
        SEPO,
        "sepo.rollouts_per_opponent",
        integer(2, why="the leave-one-out baseline compares each rollout with the others of its group"),
    ),
    (SEPO, "sepo.lr", real(0.0, strict=True)),
    (SEPO, "sepo.lr_schedule", one_of(*LR_SCHEDULES)),
    (SEPO, "sepo.lr_final_ratio", real(0.0, high=1.0, high_closed=True)),
    (SEPO, "sepo.temperature", temperature(greedy=False)),
    (SEPO, "sepo.max_new_tokens", integer(1)),
    (SEPO, "sepo.aux_episodes", integer(1)),
    (SEPO, "sepo.beta", real(0.0)),
    (SEPO, "sepo.clip_eps", real(0.0, strict=True)),
    (SEPO, "sepo.grad_clip", real(0.0, strict=True)),
    (SEPO, "sepo.optimizer", one_of("adamw", "sgd")),
    (SEPO, "sepo.momentum", real(0.0, high=1.0)),
    (SEPO, "sepo.weight_decay", real(0.0)),
    (SEPO, "sepo.reward_scale", real(0.0, strict=True)),
    (SEPO, "sepo.refresh_steps", integer(1)),
    (SEPO, "sepo.refresh_kl", real(0.0, strict=True)),
    (SEPO, "sepo.trust_region_kl", real(0.0)),
    (SEPO, "sepo.line_search_steps", integer(0)),
    (SEPO, "sepo.held_average", real(0.0, high=1.0)),
    (SEPO, "sepo.held_level_z", real(0.0)),
    (SEPO, "sepo.micro_batch", integer(1)),
    (SEPO, "sepo.micro_batch_tokens", integer(0)),
    (SEPO, "sepo.no_grad_micro_batch_tokens", integer(0)),
    (SEPO, "sepo.generate_batch", integer(0)),
    (SEPO, "sepo.logprob_chunk", integer(1)),
    (SEPO, "sepo.checkpoint_steps", step_list()),
    (SEPO, "sepo.best_response_every", integer(1)),
    (SEPO, "sepo.best_response_samples", integer(2)),
    (SEPO, "sepo.lora.r", integer(1)),
    (SEPO, "sepo.lora.alpha", real(0.0, strict=True)),
    (SEPO, "sepo.lora.dropout", real(0.0, high=1.0)),
    (SEPO, "sepo.seed", SEED),
    (SEPO, "sepo.adv_eps", real(0.0, strict=True)),
    (SEPO, "sepo.ref_4bit", boolean()),
    (SEPO, "sepo.fold_adapter_for_reads", boolean()),
    (SEPO, "sepo.debug_kill_after_step", integer(1, optional=True)),
    (SEPO, "sepo.debug_detect_anomaly", boolean()),
]


def game_rules() -> list[tuple[Callable[[DictConfig], bool], str, Rule]]:
    """The rules of each game's own keys (`key_rules` of sepo/games/<game>/), where that game is played."""
    return [
        (_game(name), f"game.{key}", rule)
        for name in games.names()
        for key, rule in games.entry(name).key_rules.items()
    ]


def penalty_rules() -> list[tuple[str, str, Rule]]:
    """The rules that name the penalty terms (sepo/penalties.py), built from the terms registered now."""
    keys, pools = penalties.keys(), penalties.trained_pools()
    return [
        *[("all", f"lambdas.{phase}.{key}", real(0.0)) for phase in ("train", "eval") for key in keys],
        (SEPO, "sepo.rollouts_by_pool", optional_integers_of(pools, 2, "pools")),
        (SEPO, "sepo.held_terms", distinct_names_of(keys, "penalty terms")),
        (SEPO, "sepo.held_at_start", distinct_names_of(keys, "penalty terms")),
    ]


def rules() -> list[tuple[str | Callable[[DictConfig], bool], str, Rule]]:
    """Every rule: the table above, the games' own and those of the penalty terms."""
    return [*RULES, *game_rules(), *penalty_rules()]


#: the stage nodes' leaves with no rule: output directories derived from `paths.*` (which `check_paths` checks),
#: resolved only inside a run
UNRULED = ("sft.data_dir", "datagen.out_dir")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def applies(where: str | Callable[[DictConfig], bool], cfg: DictConfig) -> bool:
    if callable(where):
        return where(cfg)
    return where == "all" or cfg.stage.name in where.split()
