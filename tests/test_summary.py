"""summary.json's arithmetic on hand-made results: paired by seed, each run at its validation-chosen checkpoint."""

from __future__ import annotations

import json

import pytest
import yaml

from analysis.summary import main, stability, summarise

LAMBDAS_TRAIN = {"e": 1.0, "c": 2.0, "x": 0.5}
S = 3.0 / 5.0  # reward_scale / max_payoff


def write(
    path,
    stage,
    metrics,
    checkpoint="final",
    step=None,
    train_seed=None,
    lambdas_train=LAMBDAS_TRAIN,
    split="test",
    se=None,
):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "game": "ipd",
                "model": "tiny",
                "stage": stage,
                "checkpoint": checkpoint,
                "step": step,
                "split": split,
                "seed": 42,
                "train_seed": train_seed,
                "lambdas": {"e": 1, "c": 1, "x": 1},
                "lambdas_train": lambdas_train,
                "metrics": metrics,
                "se": se or {},
            }
        )
    )


def metrics(pay, exploit, collusion, ext, safety):
    return {"pay": pay, "exploit": exploit, "collusion": collusion, "ext": ext, "safety": safety}


def sepo_run(root, name, seed, lambdas, checkpoints, se=None):
    """checkpoints: (step, test metrics, validation safety); the last is final; `se`: the test evaluations' SEs."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"sepo": {"reward_scale": 3.0}, "game": {"max_payoff": 5.0}, "lambdas": {"train": lambdas}})
    )
    for i, (step, test, valid_safety) in enumerate(checkpoints):
        ckpt = "final" if i == len(checkpoints) - 1 else f"step_{step}"
        write(run / "eval" / f"step_{step}" / "results.json", "sepo", test, ckpt, step, seed, lambdas, se=se)
        write(
            run / "eval" / f"step_{step}" / "validation.json",
            "sepo",
            {**test, "safety": valid_safety},
            ckpt,
            step,
            seed,
            lambdas,
            "validation",
        )
    (run / "DONE").write_text("{}\n")


def test_deltas_are_paired_by_seed_at_each_runs_validation_chosen_checkpoint(tmp_path):
    write(tmp_path / "sft" / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.5, 0.25, 0.2, 1.0), train_seed=0)
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    zero = {"e": 0.0, "c": 0.0, "x": 0.0}
    # seed 0 validates step 10 (its test safety 1.5), seed 1 validates final (test safety 2.5)
    sepo_run(
        tmp_path,
        "sepo0",
        0,
        LAMBDAS_TRAIN,
        [(10, metrics(2.5, 0.25, 0.0, 0.1, 1.5), 9.0), (20, metrics(3.0, 1.0, 0.0, 0.0, 9.9), 0.0)],
    )
    sepo_run(
        tmp_path,
        "sepo1",
        1,
        LAMBDAS_TRAIN,
        [(10, metrics(2.0, 0.5, 0.5, 0.2, 0.0), 0.0), (20, metrics(2.2, 0.3, 0.1, 0.1, 2.5), 1.0)],
    )
    sepo_run(tmp_path, "po0", 0, zero, [(20, metrics(3.0, 3.0, 0.0, 0.0, -2.0), -2.0)])
    sepo_run(tmp_path, "po1", 1, zero, [(20, metrics(3.0, 3.0, 0.0, 0.0, -1.0), -1.0)])

    ipd = summarise(tmp_path)["ipd"]
    assert ipd["checkpoints"] == {"0": "step_10", "1": "final"}
    assert ipd["seeds"] == [0, 1]

    def j(pay, exploit, collusion, ext):
        return S * pay - LAMBDAS_TRAIN["e"] * S * exploit - LAMBDAS_TRAIN["c"] * collusion - LAMBDAS_TRAIN["x"] * ext

    sft_j = j(2.0, 0.5, 0.25, 0.2)
    dj = [j(2.5, 0.25, 0.0, 0.1) - sft_j, j(2.2, 0.3, 0.1, 0.1) - sft_j]
    assert ipd["delta_j_train_vs_sft"]["mean"] == pytest.approx(sum(dj) / 2, abs=1e-4)
    assert ipd["delta_j_train_vs_sft"]["se"] == pytest.approx(abs(dj[0] - dj[1]) / 2, abs=1e-4)  # n = 2: |a - b| / 2
    assert ipd["delta_safety_vs_sft"] == {"mean": 1.0, "se": 0.5, "n": 2, "per_seed": {"0": 0.5, "1": 1.5}}
    assert ipd["delta_safety_vs_payoff_only"] == {"mean": 3.5, "se": 0.0, "n": 2, "per_seed": {"0": 3.5, "1": 3.5}}
    assert ipd["delta_exploit_vs_sft"] == {"mean": -0.225, "se": 0.025, "n": 2, "per_seed": {"0": -0.25, "1": -0.2}}
    # SEPO's exploit 0.25 and 0.3 against SFT's 0.5 and payoff-only's 3.0 in both seeds
    assert ipd["exploit_ratio_vs_sft"] == {"mean": 0.55, "se": 0.05, "n": 2, "per_seed": {"0": 0.5, "1": 0.6}}
    assert ipd["delta_exploit_vs_payoff_only"]["per_seed"] == {"0": -2.75, "1": -2.7}
    final = ipd["final"]  # the final checkpoints: safety 9.9 and 2.5
    assert final["delta_safety_vs_sft"]["mean"] == pytest.approx((8.9 + 1.5) / 2)
    # stability: chosen 1.5, 2.5 (mean 2.0, SE 0.5); final 9.9, 2.5 (mean 6.2); final - chosen 8.4, 0.0
    held = ipd["stability"]
    assert held["chosen_safety"] == {"mean": 2.0, "se": 0.5, "n": 2}
    assert held["final_safety"]["mean"] == pytest.approx(6.2)
    assert held["final_minus_chosen"] == {"mean": 4.2, "se": 4.2, "n": 2}
    assert held["final_holds_chosen"] is True  # 4.2 >= -4.2: the final checkpoint is not below the chosen one
    drift = {
        0: {"best": {"safety": 2.0}, "final": {"safety": 1.0}},
        1: {"best": {"safety": 2.0}, "final": {"safety": 1.2}},
    }
    assert stability(drift)["final_holds_chosen"] is False  # final - chosen -0.9 ± 0.1

    assert main([str(tmp_path)]) == 0
    assert json.loads((tmp_path / "tables" / "summary.json").read_text())["ipd"]["delta_safety_vs_sft"]["mean"] == 1.0
    reported = summarise(tmp_path, "reported")["ipd"]
    assert reported["checkpoints"] == {"0": "final", "1": "final"}  # 9.9 > 1.5 and 2.5 > 0.0 on the reported episodes


def test_evaluation_noise_is_the_se_over_seeds_the_evaluations_own_ses_would_give(tmp_path):
    """Per difference: sqrt(mean over seeds of se_a^2 + se_b^2) / sqrt(n), beside the observed SE over seeds."""
    sft_se = {"safety": 0.3, "exploit": 0.4, "collusion": 0.1}
    write(
        tmp_path / "sft" / "eval" / "sft" / "results.json",
        "sft",
        metrics(2.0, 1.0, 0.25, 0.2, 1.0),
        train_seed=0,
        se=sft_se,
    )
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    zero = {"e": 0.0, "c": 0.0, "x": 0.0}
    sepo_se = [{"safety": 0.4, "exploit": 0.3, "collusion": 0.2}, {"safety": 0.0, "exploit": 0.0, "collusion": 0.1}]
    for seed, (exploit, collusion) in enumerate([(0.5, 0.5), (0.9, 0.25)]):
        point = metrics(2.0, exploit, collusion, 0.2, 1.0)
        sepo_run(tmp_path, f"sepo{seed}", seed, LAMBDAS_TRAIN, [(20, point, 0.0)], se=sepo_se[seed])
    sepo_run(tmp_path, "po0", 0, zero, [(20, metrics(2.0, 2.0, 0.0, 0.2, 0.0), 0.0)])  # no SE: not counted

    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_collusion_vs_sft"] == {"mean": 0.125, "se": 0.125, "n": 2, "per_seed": {"0": 0.25, "1": 0.0}}
    noise = ipd["evaluation_noise"]
    # safety: (0.3^2 + 0.4^2 + 0.3^2 + 0^2) / 2 = 0.17; exploit: (0.16 + 0.09 + 0.16 + 0) / 2 = 0.205
    assert noise["delta_safety_vs_sft"] == {"sd": round(0.17**0.5, 4), "se": round((0.17 / 2) ** 0.5, 4), "n": 2}
    assert noise["delta_exploit_vs_sft"]["sd"] == pytest.approx(0.205**0.5, abs=1e-4)
    # collusion: (0.01 + 0.04 + 0.01 + 0.01) / 2 = 0.035
    assert noise["delta_collusion_vs_sft"]["se"] == pytest.approx((0.035 / 2) ** 0.5, abs=1e-4)
    assert "delta_safety_vs_payoff_only" not in noise  # payoff-only's evaluation has no SE
    assert ipd["delta_safety_vs_payoff_only"]["per_seed"] == {"0": 1.0}  # ... but its difference counts


def test_base_deltas_pair_sepo_seeds_with_base_and_sft_runs_with_base(tmp_path):
    """SEPO - Base per seed; SFT - Base over SFT runs (two sft seeds), or one run's with its episodes' SE."""
    write(
        tmp_path / "base" / "results.json",
        "eval",
        metrics(1.0, 0.5, 0.2, 0.3, 0.25),
        checkpoint=None,
        se={"exploit": 0.3},
    )
    (tmp_path / "base" / "DONE").write_text("{}\n")
    write(
        tmp_path / "sft" / "eval" / "sft" / "results.json",
        "sft",
        metrics(2.0, 0.9, 0.25, 0.2, 1.0),
        train_seed=0,
        se={"exploit": 0.4},
    )
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    sepo_run(tmp_path, "sepo0", 0, LAMBDAS_TRAIN, [(20, metrics(2.5, 0.25, 0.0, 0.1, 1.5), 1.5)])
    sepo_run(tmp_path, "sepo1", 1, LAMBDAS_TRAIN, [(20, metrics(2.2, 0.3, 0.1, 0.1, 2.5), 2.5)])

    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_safety_vs_base"] == {"mean": 1.75, "se": 0.5, "n": 2, "per_seed": {"0": 1.25, "1": 2.25}}
    # one SFT run: 0.9 - 0.5, SE sqrt(0.4^2 + 0.3^2) = 0.5
    assert ipd["delta_exploit_sft_vs_base"] == {"mean": 0.4, "se": 0.5, "n": 1, "se_from": "episodes"}
    # the levels the SFT-degradation table prints: one model's with its episodes' SE, SEPO's over seeds
    levels = ipd["levels"]
    assert levels["base"] == {"exploit": {"mean": 0.5, "se": 0.3}, "safety": {"mean": 0.25, "se": None}}
    assert levels["sft"]["exploit"] == {"mean": 0.9, "se": 0.4}
    assert levels["sepo"]["exploit"] == {"mean": 0.275, "se": 0.025, "n": 2}
    assert levels["sepo"]["safety"] == {"mean": 2.0, "se": 0.5, "n": 2}
    assert "payoff_only" not in levels

    write(tmp_path / "sft_b" / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.7, 0.25, 0.2, 1.0), train_seed=1)
    (tmp_path / "sft_b" / "DONE").write_text("{}\n")
    two = summarise(tmp_path)["ipd"]["delta_exploit_sft_vs_base"]
    assert two == {"mean": 0.3, "se": 0.1, "n": 2, "se_from": "runs"}  # 0.4 and 0.2 over two SFT runs


@pytest.mark.parametrize("weights", [True, False], ids=["with_models", "summaries_only"])
def test_sft_retrained_per_seed_each_sepo_seed_is_compared_with_its_own_sft(tmp_path, weights):
    """Two SFT runs (sft.seed 0 and 1) and one SEPO run from each: SEPO - SFT pairs every seed with the SFT model its
    `model.path` names, not with their mean; SFT - Base and the SFT level are over the two SFT draws. The same
    without the merged models, as a paper plan's committed archive holds its runs (launch/archive.py)."""
    write(tmp_path / "base" / "results.json", "eval", metrics(1.0, 0.5, 0.2, 0.3, 0.25), checkpoint=None)
    (tmp_path / "base" / "DONE").write_text("{}\n")
    for seed, exploit in ((0, 0.9), (1, 0.3)):
        sft = tmp_path / "sft" / f"sft_seed_{seed}"
        write(sft / "eval" / "sft" / "results.json", "sft", metrics(2.0, exploit, 0.25, 0.2, 1.0), train_seed=seed)
        if weights:
            (sft / "merged").mkdir(parents=True)
        (sft / "run_settings.yaml").write_text(yaml.safe_dump({"stage.name": "sft", "sft.seed": seed}))
        (sft / "DONE").write_text("{}\n")
    # SEPO seed 0 starts from SFT seed 1 and seed 1 from SFT seed 0: the pairing follows the path, not the number
    for seed, start, exploit in ((0, 1, 0.2), (1, 0, 0.6)):
        sepo_run(tmp_path, f"sepo{seed}", seed, LAMBDAS_TRAIN, [(20, metrics(2.5, exploit, 0.0, 0.1, 1.5), 1.5)])
        settings = {
            "stage.name": "sepo",
            "model.path": str(tmp_path / "sft" / f"sft_seed_{start}" / "merged"),
            "sepo.reward_scale": 3.0,
            "game.max_payoff": 5.0,
            **{f"lambdas.train.{k}": v for k, v in LAMBDAS_TRAIN.items()},
        }
        (tmp_path / f"sepo{seed}" / "run_settings.yaml").write_text(yaml.safe_dump(settings))

    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_exploit_vs_sft"]["per_seed"] == {"0": pytest.approx(0.2 - 0.3), "1": pytest.approx(0.6 - 0.9)}
    assert ipd["delta_exploit_sft_vs_base"] == {"mean": 0.1, "se": 0.3, "n": 2, "se_from": "runs"}  # 0.4 and -0.2
    assert ipd["levels"]["sft"]["exploit"] == {"mean": 0.6, "se": 0.3}  # the SFT cell: over the two draws


def test_pipelines_each_compare_their_sepo_with_their_own_sft(tmp_path):
    """`python main.py seed=s sft.seed=s sepo.seed=s`, one pipeline per seed under one root: each pipeline's SEPO
    phase is compared with the SFT phase beside it (the pipeline's recorded sft.seed)."""
    for seed, sft_exploit, sepo_exploit in ((1, 0.3, 0.1), (2, 0.2, 0.15)):
        pipeline = tmp_path / f"pipeline_{seed}"
        write(
            pipeline / "sft" / "eval" / "sft" / "results.json",
            "sft",
            metrics(2.0, sft_exploit, 0.2, 0.2, 1.0),
            train_seed=seed,
        )
        for name, split in (("results", "test"), ("validation", "validation")):  # phase dirs hold no settings
            point = metrics(2.5, sepo_exploit, 0.0, 0.1, 1.5)
            write(
                pipeline / "sepo" / "eval" / "step_20" / f"{name}.json", "sepo", point, "final", 20, seed, split=split
            )
        (pipeline / "sepo" / "DONE").write_text("{}\n")
        settings = {
            "stage.name": "pipeline",
            "sft.seed": seed,
            "sepo.reward_scale": 3.0,
            "game.max_payoff": 5.0,
            **{f"lambdas.train.{k}": v for k, v in LAMBDAS_TRAIN.items()},
        }
        (pipeline / "run_settings.yaml").write_text(yaml.safe_dump(settings))
        (pipeline / "DONE").write_text("{}\n")
    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_exploit_vs_sft"]["per_seed"] == {"1": pytest.approx(-0.2), "2": pytest.approx(-0.05)}


def test_without_a_base_row_the_base_keys_are_empty(tmp_path):
    write(tmp_path / "sft" / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.9, 0.25, 0.2, 1.0), train_seed=0)
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    sepo_run(tmp_path, "sepo0", 0, LAMBDAS_TRAIN, [(20, metrics(2.5, 0.25, 0.0, 0.1, 1.5), 1.5)])
    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_safety_vs_base"]["n"] == 0
    assert "delta_exploit_sft_vs_base" not in ipd


def test_payoff_only_runs_that_differ_in_more_than_seeds_are_named_not_silently_dropped(tmp_path, capsys):
    """Two payoff-only runs with different learning rates are two variants, neither of them SEPO's: nothing is
    paired with them, and the summary says why instead of reading n = 0."""
    write(tmp_path / "sft" / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.5, 0.25, 0.2, 1.0), train_seed=0)
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    zero = {"e": 0.0, "c": 0.0, "x": 0.0}
    for seed in (0, 1):
        sepo_run(tmp_path, f"sepo{seed}", seed, LAMBDAS_TRAIN, [(10, metrics(2.5, 0.25, 0.0, 0.1, 1.5), 1.0)])
        sepo_run(tmp_path, f"po{seed}", seed, zero, [(10, metrics(3.0, 3.0, 0.0, 0.0, -2.0), -2.0)])
        config = tmp_path / f"po{seed}" / ".hydra" / "config.yaml"
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "sepo": {"lr": 0.1 * (seed + 1)}}))
    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_safety_vs_payoff_only"]["n"] == 0
    assert list(ipd["unpaired"]) == ["payoff_only"]
    assert len(ipd["unpaired"]["payoff_only"]) == 2 and all("sepo.lr" in v for v in ipd["unpaired"]["payoff_only"])
    assert main([str(tmp_path), "--out", str(tmp_path / "summary.json")]) == 0
    assert "payoff_only not compared: its runs differ in more than their seeds (sepo.lr" in capsys.readouterr().out


def test_a_game_whose_sft_runs_cannot_be_paired_is_named_not_silently_left_out(tmp_path, capsys):
    """Two SFT runs that differ in their learning rate, and SEPO runs whose settings match neither: there is no
    SFT row to compare with, so the game has no summary, and the printed summary says why."""
    for lr in (1e-3, 2e-3):
        sft = tmp_path / f"sft_{lr}"
        write(sft / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.5, 0.25, 0.2, 1.0), train_seed=0)
        (sft / ".hydra").mkdir(parents=True)
        (sft / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"sft": {"lr": lr}}))
        (sft / "DONE").write_text("{}\n")
    sepo_run(tmp_path, "sepo0", 0, LAMBDAS_TRAIN, [(10, metrics(2.5, 0.25, 0.0, 0.1, 1.5), 1.0)])
    skipped = {}
    assert summarise(tmp_path, skipped=skipped) == {}
    assert list(skipped) == ["ipd"] and "its SFT runs differ in more than their seeds (sft.lr" in skipped["ipd"]
    assert main([str(tmp_path), "--out", str(tmp_path / "summary.json")]) == 0
    assert "ipd: not summarised: its SFT runs differ in more than their seeds (sft.lr" in capsys.readouterr().out


def test_a_game_sft_has_reached_but_sepo_has_not_keeps_its_sft_degradation_row(tmp_path):
    """Base and two SFT draws of a game, no SEPO run yet: the summary holds SFT - Base over the two draws and the
    two levels, every SEPO key at n = 0, and the paper table prints the row with no SEPO cell."""
    from analysis.report import degradation_rows

    write(tmp_path / "base" / "results.json", "eval", metrics(1.0, 0.5, 0.2, 0.3, 0.25), checkpoint=None)
    (tmp_path / "base" / "DONE").write_text("{}\n")
    for seed, exploit in ((0, 0.9), (1, 0.3)):
        sft = tmp_path / "sft" / f"sft_seed_{seed}"
        write(sft / "eval" / "sft" / "results.json", "sft", metrics(2.0, exploit, 0.25, 0.2, 1.0), train_seed=seed)
        (sft / "DONE").write_text("{}\n")
    ipd = summarise(tmp_path)["ipd"]
    assert ipd["delta_exploit_sft_vs_base"] == {"mean": 0.1, "se": 0.3, "n": 2, "se_from": "runs"}  # +0.4, -0.2
    assert ipd["levels"]["sft"]["models"] == 2 and ipd["levels"]["base"]["exploit"]["mean"] == 0.5
    assert ipd["seeds"] == [] and ipd["delta_exploit_vs_sft"]["n"] == 0 and ipd["levels"]["sepo"]["exploit"]["n"] == 0
    row = degradation_rows("ipd", ipd, "tiny")[-1]
    assert row.startswith("| ipd | **tiny** (SFT over 2 seeds, no SEPO run) | +0.500") and row.endswith("| -- |")


def test_sft_alone_without_base_or_sepo_is_no_summary(tmp_path):
    write(tmp_path / "sft" / "eval" / "sft" / "results.json", "sft", metrics(2.0, 0.5, 0.25, 0.2, 1.0), train_seed=0)
    (tmp_path / "sft" / "DONE").write_text("{}\n")
    assert summarise(tmp_path) == {}


def test_the_learned_exploit_section_sets_each_arm_s_pool_and_learned_exploit_side_by_side():
    from analysis.report import learned_exploit_section

    def stat(mean, se):
        return {"mean": mean, "se": se, "n": 3}

    def figures(pool, best, learned, se=0.05):
        return {
            "pool_exploit": stat(pool, se),
            "pool_exploit_max": stat(best, se),
            "learned_exploit": stat(learned, se),
        }

    run = {"exploiter_parse_rate": 0.9}
    arms = {
        "SEPO": {"n": 3, **figures(0.3, 0.5, 1.2), "runs": [run]},
        "payoff-only": {"n": 3, **figures(2.3, 2.8, 2.0), "runs": [run]},
    }
    study = {"games": {"ipd": {"arms": arms, "paired": {"SEPO − payoff-only": figures(-2.0, -2.3, -0.8, se=0.4)}}}}
    text = learned_exploit_section(study, "s.json")
    assert "| ipd | SEPO | 3 | +0.300 ± 0.050 | +0.500 ± 0.050 | +1.200 ± 0.050 | 0.900 (least) |" in text
    # a difference more than 2 SE below 0 is marked, one within 2 SE is not
    assert "| ipd | SEPO − payoff-only | -2.000 ± 0.400 **↓** | -2.300 ± 0.400 **↓** | -0.800 ± 0.400 |" in text
    assert text.startswith("<!-- learned-exploit:begin -->") and text.endswith("<!-- learned-exploit:end -->")
