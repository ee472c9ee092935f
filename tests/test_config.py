"""Every config file composes and validates; bad input ends in one line naming key and allowed values."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sepo.errors import ConfigError
from sepo.run.config import PoolOverlapWarning, validate

CONF = Path(__file__).resolve().parent.parent / "conf"


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("game", options("game"))
def test_every_game_composes_with_its_lambdas_and_validates(compose_cfg, game):
    cfg = compose_cfg(f"game={game}")
    assert cfg.game.name == game
    assert set(cfg.lambdas.train) == set(cfg.lambdas.eval) == {"e", "c", "x"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoolOverlapWarning)
        validate(cfg)


@pytest.mark.parametrize("group", ["model", "stage", "lambdas", "logger", "eval", "datagen"])
def test_every_option_of_every_group_composes(compose_cfg, group):
    for option in options(group):
        cfg = compose_cfg(f"{group}={option}")
        written = OmegaConf.load(CONF / group / f"{option}.yaml")
        keys = set(written) - {"defaults"}
        assert keys <= set(cfg[group]), f"{group}={option}: its keys are in the composed config"
        if "name" in written:
            assert cfg[group].name == written.name


def test_lambdas_follow_the_game_unless_overridden(compose_cfg):
    assert compose_cfg("game=ipd").lambdas.train.e == 2.4
    assert compose_cfg("game=ipd", "lambdas=zero").lambdas.train.e == 0.0


def test_pool_overlap_is_a_warning_naming_the_strategy(compose_cfg):
    cfg = compose_cfg("game.pools.collusive=[TFT]")
    with pytest.warns(PoolOverlapWarning, match="TFT is in pools train, collusive"):
        validate(cfg)


@pytest.mark.parametrize(
    "override,message",
    [
        ("lambdas.eval.e=-1", "lambdas.eval.e=-1.0 is not allowed; allowed: a number >= 0"),
        ("model.strategy=Nope", "model.strategy: unknown ipd strategy 'Nope'; allowed: AltD"),
        ("game.pools.exploit=[AlwaysD,Bogus]", "game.pools.exploit: unknown ipd strategy 'Bogus'"),
        ("+game.demonstrators.Bogus=1.0", "game.demonstrators: unknown ipd strategy 'Bogus'"),
        ("eval.episodes_per_opponent=0", "eval.episodes_per_opponent=0 is not allowed; allowed: an integer >= 1"),
    ],
)
def test_validation_errors_name_the_key(compose_cfg, override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        validate(compose_cfg("stage=eval", "model=scripted", override))


@pytest.mark.parametrize(
    "args,key,allowed",
    [
        (["game=chess"], "game=chess", "ipd"),
        (["stage=foo"], "stage=foo", "eval"),
        (["-m", "game=ipd,chess"], "game=chess", "ipd"),
        (["lambdas.eval.e=-0.5"], "lambdas.eval.e=-0.5", ">= 0"),
        (["stage=eval", "model=scripted", "model.strategy=Nope"], "model.strategy", "TFT"),
    ],
)
def test_cli_errors_are_one_line_without_traceback(cli, args, key, allowed):
    proc = cli(*args, "logger=none")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and key in lines[0] and allowed in lines[0] and "allowed" in lines[0] or ">=" in lines[0]


def test_strategy_params_come_from_the_game_config(compose_cfg):
    from sepo.games.strategy import make_strategy

    cfg = compose_cfg("game=neg_v1", "game.strategy_params.Hard.demand=9")
    assert make_strategy(cfg.game, "Hard").act({"round": 0, "history": []}, [str(d) for d in range(1, 10)], None) == "9"
    ipd = compose_cfg("game=ipd", "game.strategy_params.NoisyTFT.flip=1.0")
    assert (
        make_strategy(ipd.game, "NoisyTFT").act(
            {"round": 0, "history": []}, ["COOPERATE", "DEFECT"], __import__("numpy").random.default_rng(0)
        )
        == "DEFECT"
    )
    bad = compose_cfg("game=ipd", "+game.strategy_params.TFT.speed=2")
    with pytest.raises(ConfigError, match="game.strategy_params.TFT"):
        make_strategy(bad.game, "TFT")


def test_game_and_model_defaults_of_stage_settings_and_command_line_precedence(compose_cfg):
    kuhn = compose_cfg("game=kuhn", "model=scripted")
    assert (kuhn.sepo.lr, kuhn.sepo.beta) == (3.0e-6, 0.2)
    ipd = compose_cfg("game=ipd", "model=scripted")
    assert (ipd.sepo.lr, ipd.sepo.beta) == (1.0e-5, 0.01)
    assert compose_cfg("game=kuhn", "model=scripted", "sepo.lr=1e-4").sepo.lr == 1e-4
    assert ipd.sepo.steps == 100
    assert ipd.eval.max_new_tokens == 256
    assert ipd.eval.episodes_per_opponent == 20
    tiny = compose_cfg("game=kuhn", "model=tiny")  # the model's own defaults, then the game's, then docs/spec.md §4
    assert (tiny.sepo.lr, tiny.sepo.beta, tiny.sepo.steps, tiny.eval.max_new_tokens) == (3.0, 0.2, 60, 48)
    assert (tiny.sepo.optimizer, tiny.sepo.trust_region_kl) == ("sgd", 0.05)  # the main job's choice (docs/results.md)
    assert compose_cfg("model=tiny", "sepo.steps=3", "eval.max_new_tokens=7").sepo.steps == 3
    # a model's defaults for one game (conf/sepo/model_game/<model>_<game>.yaml) reach that game only
    kuhn, ipd = compose_cfg("game=kuhn", "model=smollm2"), compose_cfg("game=ipd", "model=smollm2")
    assert (kuhn.sepo.estimator, kuhn.sepo.optimizer, kuhn.sepo.lr, kuhn.sepo.steps) == (
        "exact_values",
        "sgd",
        0.03,
        40,
    )
    assert (ipd.sepo.estimator, ipd.sepo.optimizer, ipd.sepo.lr, ipd.sepo.steps) == ("rollouts", "sgd", 0.5, 12)
    assert (list(ipd.sepo.held_terms), ipd.sepo.rollouts_by_pool.collusive) == (["c"], 16)
    assert (ipd.eval.episodes_per_opponent, kuhn.eval.episodes_per_opponent) == (20, 6)  # conf/eval/model_game/
    auction = compose_cfg("game=auction", "model=smollm2")
    assert (auction.sepo.optimizer, auction.sepo.lr, auction.sepo.steps, auction.eval.episodes_per_opponent) == (
        "adamw",
        2e-4,
        8,
        6,
    )
    assert compose_cfg("game=kuhn", "model=smollm2", "sepo.steps=3").sepo.steps == 3


EXPECTED_CHOICES = {
    "paper_ipd": {"stage": "pipeline", "game": "ipd"},
    "paper_auction": {"stage": "pipeline", "game": "auction"},
    "paper_kuhn": {"stage": "pipeline", "game": "kuhn"},
    "paper_negotiation": {"stage": "pipeline", "game": "neg_v2", "model": "gemma4"},
    "paper_sft_degradation": {"stage": "pipeline"},
    "paper_grid": {"stage": "pipeline"},
    "ablation_penalty_mode": {"stage": "sepo", "game": "ipd"},
    "tiny_paper": {"model": "tiny", "logger": "none"},  # launch/tiny_paper.sh's shared settings, not a sweep
    "tiny_paper_ipd": {"model": "tiny", "logger": "none"},  # ... and what was tuned per game on top
    "tiny_paper_kuhn": {"model": "tiny", "logger": "none"},
    "smollm2_paper": {"model": "smollm2", "logger": "none"},  # `launch/tiny_paper.sh --model smollm2`
    "gemma4_paper": {"model": "gemma4", "logger": "wandb"},  # `launch/paper_plan.sh --model gemma4`
    "qwen_paper": {"model": "qwen", "logger": "wandb"},
    "sepo_safety": {"model": "tiny", "logger": "none"},  # launch/sepo_safety.sh's shared settings
}

#: what each paper preset sets: (sepo.steps, sepo.lr_schedule, sepo.refresh_steps, eval.episodes_per_opponent)
PAPER_SETTINGS = {
    "tiny_paper": (40, "constant", 5, 20),
    "tiny_paper_ipd": (80, "cosine", 5, 20),
    "tiny_paper_kuhn": (40, "constant", 1, 20),
    # smollm2's own defaults at the preset's game, IPD: the pipeline's (conf/{sepo,eval}/model_game/smollm2_ipd.yaml)
    "smollm2_paper": (12, "cosine", 1, 20),
    "gemma4_paper": (100, "constant", 5, 20),  # the paper's sizes: the stages' defaults
    "qwen_paper": (100, "constant", 5, 20),
    "sepo_safety": (60, "cosine", 1, 20),  # the main job's settings (the launcher's --steps sets every arm's)
}


@pytest.mark.parametrize("preset", options("experiment"))
def test_every_experiment_preset_composes_with_its_choices(preset, tmp_path):
    from sepo.run.compose import compose_config

    cfg = compose_config([f"+experiment={preset}", f"paths.output_dir={tmp_path}"], with_hydra=True)
    choices = cfg.hydra.runtime.choices
    for group, option in EXPECTED_CHOICES[preset].items():
        assert choices[group] == option, (preset, group)
    assert choices["lambdas"] == choices["game"]  # lambdas still follow the preset's game
    if preset in PAPER_SETTINGS:  # the launcher makes the sweeps; the presets hold what its jobs share
        s = cfg.sepo
        assert (s.steps, s.lr_schedule, s.refresh_steps, cfg.eval.episodes_per_opponent) == PAPER_SETTINGS[preset]
        return
    assert cfg.sweep_name == preset
    assert cfg.hydra.mode.name == "MULTIRUN"
    if preset == "ablation_penalty_mode":
        assert cfg.hydra.sweeper.params["sepo.penalty_mode"] == "shared,per_rollout,pooled"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["stage=sft", "sft.warmup_ratio=1.0"], "sft.warmup_ratio=1.0 is not allowed; allowed: a number in [0, 1)"),
        (["stage=sft", "sft.save_steps=0"], "sft.save_steps=0 is not allowed; allowed: an integer >= 1 (optimizer"),
        (["stage=sft", "sft.max_length=0"], "sft.max_length=0 is not allowed; allowed: an integer >= 1"),
        (
            ["stage=sepo", "sepo.adv_scale_decay=1.0"],
            "sepo.adv_scale_decay=1.0 is not allowed; allowed: a number in [0, 1)",
        ),
        (["stage=sepo", "sepo.exploit_switch_episodes=0"], "sepo.exploit_switch_episodes=0 is not allowed"),
        (["stage=sepo", "sepo.credit=episode"], "sepo.credit=episode is not allowed; allowed: return_to_go, round"),
        (["stage=eval", "model=scripted", "resume=sometimes"], "resume=sometimes is not allowed; allowed: auto, never"),
        (["stage=eval", "model=scripted", "datagen.valid_fraction=1"], "datagen.valid_fraction=1.0 is not allowed"),
        (["stage=eval", "model=scripted", "eval.phase=final"], "eval.phase=final is not allowed; allowed: null, sft"),
        (
            ["stage=eval", "model=scripted", "lambdas.train.c=-1"],
            "lambdas.train.c=-1.0 is not allowed; allowed: a number >= 0",
        ),
        (["stage=eval", "model=scripted", "game.rounds=0"], "game.rounds=0 is not allowed; allowed: an integer >= 1"),
        (["stage=eval", "model=scripted", "game.demonstrators.TFT=-1"], "game.demonstrators.TFT=-1.0 is not allowed"),
        (
            ["stage=sft", "sft.prefix_sharing=true", "sft.answer_logits_only=false"],
            "sft.prefix_sharing=true needs sft.answer",
        ),
    ],
)
def test_one_rules_table_checks_every_field_before_any_work(compose_cfg, overrides, message):
    """The checks that once sat in sft_settings, sepo_settings and a second number checker are rows of
    sepo/run/rules.py's table (or, between fields, sepo/run/config.py's relations) and fail the same way."""
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate(compose_cfg(*overrides))


def test_the_stage_settings_only_resolve():
    """sft_settings and sepo_settings no longer check values (sepo/run/config.py does, once)."""
    import inspect

    from sepo.stages.sft import sft_settings
    from sepo.training.objective import sepo_settings

    assert "ConfigError" not in inspect.getsource(sepo_settings)
    assert "is not allowed" not in inspect.getsource(sft_settings)
    import sepo.run.config

    assert not hasattr(sepo.run.config, "_check_number")
    assert not hasattr(sepo.run.config, "check_model_and_logger")


@pytest.mark.parametrize(
    "choice", [["model=tiny"], ["model=smollm2", "game=kuhn"], ["model=gemma4", "game=neg_v2"], ["model=qwen"]]
)
def test_every_leaf_of_the_config_has_a_rule_or_says_why_not(choice):
    """Every value of every node is checked before any work, by its field's rule or by the check its schema
    names, so a typo such as sft.bf16=maybe stops the run in one line instead of reaching the code."""
    from omegaconf import DictConfig

    from sepo.run.compose import compose_config
    from sepo.run.rules import field_rules
    from sepo.run.schema import GROUP_NODE

    cfg = compose_config([*choice, "logger=wandb"])
    covered = {row.key for row in field_rules() if row.rule is not None or row.reason not in ("", GROUP_NODE)}
    leaves = []

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            key = f"{prefix}.{name}" if prefix else str(name)
            child = node._get_node(name)
            if key not in covered and isinstance(child, DictConfig):
                walk(child, key)
            else:
                leaves.append(key)

    walk(cfg, "")
    assert [key for key in leaves if key not in covered] == []
    assert {"sepo.lr", "sft.lora.r", "model.dtype", "game.rounds", "lambdas.train.e", "logger.mode"} <= set(leaves)


def test_a_field_s_rule_is_its_schema_s_metadata():
    """The rules are read off the schemas: a field's metadata is the one place its allowed values are written."""
    from dataclasses import fields

    from sepo.run.rules import rules
    from sepo.run.schema import SepoSchema

    steps = next(f for f in fields(SepoSchema) if f.name == "steps")
    rule = next(r for _, key, r in rules() if key == "sepo.steps")
    assert rule is steps.metadata["rule"]
    assert rule.allowed == "an integer >= 1"


@pytest.mark.parametrize("model", ["tiny", "smollm2", "gemma4", "qwen"])
def test_every_stage_node_is_composed_onto_its_schema(model):
    """Each stage node has its schema's type, so a value takes its key's type (an integer given to a real
    becomes a float) and a value of another kind is refused at composition; the command line's check says
    so in its rule's one line."""
    from omegaconf import OmegaConf

    from sepo.run.cli import check_values
    from sepo.run.compose import compose_config
    from sepo.run.schema import SCHEMAS

    cfg = compose_config([f"model={model}", "logger=none", "sepo.lora.alpha=16", "sft.epochs=2"])
    for stage, schema in SCHEMAS.items():
        assert OmegaConf.get_type(cfg[stage]) is schema, stage
    assert type(cfg.sepo.lora.alpha) is float
    assert type(cfg.sft.epochs) is float
    line = check_values([f"model={model}", "sepo.micro_batch=big"])
    assert line == "error: sepo.micro_batch='big' is not allowed; allowed: an integer >= 1"
    line = check_values([f"model={model}", "sepo.checkpoint_steps=[a]"])
    assert line.startswith("error: sepo.checkpoint_steps=['a'] is not allowed; allowed: a list of integers")
    assert check_values([f"model={model}", "sepo.micro_batch=4"]) is None


@pytest.mark.parametrize("preset", [[], ["+experiment=smollm2_paper"]])
def test_smollm2_s_best_responders_read_the_policy_only_where_a_checkpoint_s_evaluation_reads_it(preset):
    """A read of Kuhn's played table costs ~55 s on 2 cores; where the best responders' refresh falls on an
    evaluated checkpoint, that evaluation's test read serves it (docs/speed.md §5o: every 5 with a checkpoint at 4
    read the policy once more). Rollout batches have such responders (exact-value batches hold their own)."""
    from sepo.run.compose import compose_config

    s = compose_config(["model=smollm2", "game=kuhn", "sepo.estimator=rollouts", *preset]).sepo
    refreshes = set(range(int(s.best_response_every), int(s.steps) + 1, int(s.best_response_every)))
    assert refreshes <= {int(k) for k in s.checkpoint_steps} | {int(s.steps)}
    assert refreshes  # the responders do re-read the policy during the run
