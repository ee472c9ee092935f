"""The studies: which targets a main-job candidate meets and which it chooses; the learned-exploit study's runs."""

import json
from pathlib import Path

import pytest

from benchmarks.studies.main_job_seeds import choice_key, summarise


def row(delta_safety: float, delta_collusion: float, se: float = 0.1) -> dict[str, float]:
    return {"delta_safety": delta_safety, "delta_collusion": delta_collusion, "delta_safety_se": se}


def test_a_candidate_that_raises_collusion_in_one_seed_loses_to_one_that_meets_every_target():
    steady = summarise({"1": row(0.2, 0.0), "2": row(0.3, -0.1), "3": row(0.25, -0.05)})
    bolder = summarise({"1": row(0.6, 0.013), "2": row(0.9, -0.1), "3": row(0.7, -0.05)})
    assert all(steady["targets"].values())
    assert not bolder["targets"]["collusion not above SFT's in any seed"]
    assert bolder["worst_delta_safety"] > steady["worst_delta_safety"]
    assert max([bolder, steady], key=choice_key) is steady


def test_a_seed_whose_j_falls_by_more_than_two_of_its_ses_fails_that_target():
    within = summarise(
        {"1": row(-0.19, 0.0), "2": row(0.5, 0.0), "3": row(0.5, 0.0), "4": row(0.5, 0.0), "5": row(0.5, 0.0)}
    )
    beyond = summarise(
        {"1": row(-0.21, 0.0), "2": row(0.5, 0.0), "3": row(0.5, 0.0), "4": row(0.5, 0.0), "5": row(0.5, 0.0)}
    )
    key = "safety not below SFT's by more than 2 SE in any seed"
    assert within["targets"][key] and not beyond["targets"][key]
    # one seed of five below SFT is allowed by "all seeds but at most one in five"
    assert beyond["targets"]["safety above SFT's in all seeds but at most one in five"]


def test_the_ipd_fit_counts_each_feature_and_the_best_deterministic_agent_defects_only_in_the_last_round(tmp_path):
    """benchmarks/studies/ipd_reactive.py: TFT against AltD (D, C, D, ... for 8 rounds) cooperates in round 1, after
    each of AltD's 3 cooperations, never after its 4 defections, and meets no cooperation before the last round
    (AltD defects in round 7); at IPD's lambdas the deterministic agent with the highest exact J is TFT that defects
    in the last round after a cooperation: J 2.1977 and collusion 1/8 (docs/results.md, round 3); among those the
    exploit pool cannot gain on, suspicious TFT."""
    import json

    from benchmarks.studies.ipd_reactive import fit, move_row, optimum
    from sepo.run.compose import compose_config

    altd = ["DEFECT" if t % 2 == 0 else "COOPERATE" for t in range(8)]
    tft = ["COOPERATE"] + ["COOPERATE" if o == "COOPERATE" else "DEFECT" for o in altd[:-1]]
    episode = {"rounds": 8, "actions": [[a, o] for a, o in zip(tft, altd)]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"per_episode": [episode]}))
    assert fit(path) == [round(1.5 / 2, 4), round(3.5 / 4, 4), round(0.5 / 5, 4), 0.5]
    # the same episode played by AlwaysD: P(C) first 0.75 -> 0.25 and after C 0.875 -> 0.125, the rest unchanged,
    # a move (-2.197, -3.892, 0, 0) in logits, whose cosine with (-1, -1, -1, -1) / 2 is 3.045 / 4.469
    always_d = tmp_path / "always_d.json"
    always_d.write_text(json.dumps({"per_episode": [{**episode, "actions": [["DEFECT", o] for o in altd]}]}))
    assert move_row(path, always_d)["cosine_with_defecting_alike"] == 0.681

    cfg = compose_config(["game=ipd", "model=smollm2", "logger=none"])
    best = optimum(cfg, step=1.0)
    assert best["agent"] == {"p0": 1.0, "pC": 1.0, "pD": 0.0, "pC_last": 0.0}
    assert best["J"] == 2.1977 and best["collusion"] == 0.125
    # its exploitability: AlwaysD takes 5 in round 1 of 8 (5/8), AltD's rounds net 0 (four +5, four -5): 5/16
    assert best["exploit"] == 0.3125
    # with none allowed, J's best deterministic agent opens with DEFECT, then plays TFT and cooperates after a
    # cooperation in the last round: AlwaysD and AltD gain nothing, AlwaysC loses round 1 only (collusion 1/8)
    unexploitable = optimum(cfg, step=1.0, exploit_cap=0.0)
    assert unexploitable["agent"] == {"p0": 0.0, "pC": 1.0, "pD": 0.0, "pC_last": 1.0}
    assert unexploitable["exploit"] == 0.0 and unexploitable["collusion"] == 0.125
    assert unexploitable["J"] < best["J"]


def test_paired_noise_is_the_spread_of_the_differences_over_evaluation_seeds_beside_the_independent_bound():
    """benchmarks/studies/paired_noise.py: two seeds whose SEPO - SFT exploit differences are -0.5 and -0.1 (SD over
    seeds |a - b| / sqrt(2) = 0.2828), reads with SEs 0.3 and 0.4 (sqrt(0.09 + 0.16) = 0.5) on both seeds."""
    from benchmarks.studies.paired_noise import noise

    def read(exploit, se):
        keys = ("exploit", "collusion", "safety", "pay")
        return {"metrics": {k: exploit if k == "exploit" else 0.0 for k in keys}, "se": dict.fromkeys(keys, se)}

    per_seed = {
        1: {"sepo": read(0.5, 0.3), "sft": read(1.0, 0.4)},
        2: {"sepo": read(0.9, 0.3), "sft": read(1.0, 0.4)},
    }
    exploit = noise(per_seed)["exploit"]
    assert exploit == {"mean_difference": -0.3, "sd_over_seeds": 0.2828, "sd_if_independent": 0.5}
    assert noise(per_seed)["collusion"]["sd_over_seeds"] == 0.0


def test_the_ipd_coupling_study_reads_which_move_a_line_names_and_draws_histories_per_feature(tmp_path):
    """benchmarks/studies/ipd_coupling.py: the SFT data's IPD lines that look back name the opponent's last move
    (reciprocate, trust: COOPERATE; retaliate, forgive, punish: DEFECT), the others name none, and so does a line
    that names both; TFT against AltD (D, C, D, ... for 8 rounds) has one first-round history, 3 histories after a
    cooperation before the last round (rounds 3, 5 and 7), 4 after a defection (rounds 2, 4, 6, 8) and none in the
    last round after a cooperation."""
    import json

    from benchmarks.studies.ipd_coupling import histories, named_last_move
    from sepo.games import entry

    names = {"reciprocate": "COOPERATE", "trust": "COOPERATE", "retaliate": "DEFECT", "forgive": "DEFECT",
             "punish": "DEFECT"}  # fmt: skip
    for case, phrases in entry("ipd").reasoning.phrases.items():
        for phrase in phrases:
            assert named_last_move(phrase.format(action="DEFECT", r=3, first=2) + "\nDEFECT") == names.get(case), phrase
    assert named_last_move("They cooperated, then defected.\nDEFECT") is None and named_last_move(None) is None

    altd = ["DEFECT" if t % 2 == 0 else "COOPERATE" for t in range(8)]
    tft = ["COOPERATE"] + ["COOPERATE" if o == "COOPERATE" else "DEFECT" for o in altd[:-1]]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"per_episode": [{"rounds": 8, "actions": [[a, o] for a, o in zip(tft, altd)]}]}))
    drawn = histories(path, per_feature=8, rounds=8)
    assert {name: len(found) for name, found in drawn.items()} == {"p0": 1, "pC": 3, "pD": 4, "pC_last": 0}
    assert sorted(len(h) for h in drawn["pC"]) == [2, 4, 6] and sorted(len(h) for h in drawn["pD"]) == [1, 3, 5, 7]


def test_the_last_moves_read_tells_an_answer_to_the_opponent_from_a_repeat_of_ones_own_move():
    """benchmarks/studies/ipd_coupling.py --last-moves: TFT answers the opponent's last move alone (effect 1 on
    P(COOPERATE), its own move 0), AlwaysD neither; a rule that repeats its own last move reads the other way."""
    from omegaconf import OmegaConf

    from benchmarks.studies.ipd_coupling import last_moves_histories, read_last_moves
    from sepo.games import make_game
    from sepo.games.strategy import make_strategy
    from sepo.policies.base import Decision
    from sepo.policies.scripted import ScriptedPolicy

    game = make_game(OmegaConf.load("conf/game/ipd.yaml"))
    assert [len(h) for h in last_moves_histories(2).values()] == [3, 3, 3, 3]
    tft = read_last_moves(game, ScriptedPolicy(make_strategy(game.cfg, "TFT")), samples=2)
    assert (
        tft["round 2"]["effect_on_p_cooperate"]
        == tft["round 4"]["effect_on_p_cooperate"]
        == {"opponent": 1.0, "own": 0.0}
    )
    assert tft["round 4"]["p_cooperate"] == {
        "own C opp C": 1.0,
        "own C opp D": 0.0,
        "own D opp C": 1.0,
        "own D opp D": 0.0,
    }
    always_d = read_last_moves(game, ScriptedPolicy(make_strategy(game.cfg, "AlwaysD")), samples=2)
    assert always_d["round 2"]["effect_on_p_cooperate"] == {"opponent": 0.0, "own": 0.0}

    class RepeatsItself:
        def act_batch(self, requests):
            return [Decision(action=r.observation["history"][-1]["own"]) for r in requests]

    assert read_last_moves(game, RepeatsItself(), samples=2)["round 2"]["effect_on_p_cooperate"] == {
        "opponent": 0.0,
        "own": 1.0,
    }


def test_the_natural_direction_solves_the_damped_fisher_system_through_its_small_side():
    """benchmarks/studies/ipd_coupling.py: Woodbury's N x N solve gives the same (F + d I)^-1 g as the P x P one,
    with F = G^T G / N and d a tenth of F's mean non-zero eigenvalue, and the quadratic KL d^T F d / 2."""
    import torch

    from benchmarks.studies.ipd_coupling import natural_direction

    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 12, generator=generator, dtype=torch.float64)
    gradient = torch.randn(12, generator=generator, dtype=torch.float64)
    fisher = scores.T @ scores / 5
    damping = 0.1 * float(torch.trace(fisher)) / 5  # trace(F) is the sum of its 5 non-zero eigenvalues
    direct = torch.linalg.solve(fisher + damping * torch.eye(12, dtype=torch.float64), gradient)
    direction, quadratic_kl = natural_direction(scores, gradient)
    assert torch.allclose(direction, direct, atol=1e-10)
    assert abs(quadratic_kl - 0.5 * float(direct @ fisher @ direct)) < 1e-10


def test_bfloat16_reads_a_rounding_floor_where_float32_reads_the_move(compose_cfg, tmp_path):
    """benchmarks/studies/rounding_floor.py on tiny's IPD batch: a move of the adapter by 1e-6 changes float32's
    log-probs in proportion to the move, and bfloat16's by the rounding floor, which does not grow with the move."""
    from benchmarks.studies.rounding_floor import measure

    from .conftest import SMALL

    read = {
        dtype: measure(compose_cfg(*SMALL, f"paths.cache_dir={tmp_path}", f"model.dtype={dtype}"), [1e-12, 1e-6, 1e-4])
        for dtype in ("float32", "bfloat16")
    }
    fp32, bf16 = ([row["mean_abs_logprob_change"] for row in read[d]["floor"]] for d in ("float32", "bfloat16"))
    assert read["bfloat16"]["dtype"] == "bfloat16" and read["float32"]["dtype"] == "float32"
    assert fp32[0] == 0.0 and bf16[0] == 0.0  # lost in rounding in both
    assert 30 < fp32[2] / fp32[1] < 300  # float32: the change grows with the move (100x)
    assert bf16[1] > 50 * fp32[1]  # bfloat16: a move of 1e-6 re-rounds the activations
    assert bf16[2] < 3 * bf16[1]  # and a move 100x larger reads about the same: a floor, not the move


def test_learned_exploit_names_a_run_per_victim_and_seed_and_averages_over_seeds():
    from benchmarks.studies.learned_exploit import label_of, summarise

    assert label_of("scripted:LooseA") == "scripted_LooseA"
    assert label_of("/x/tiny_paper/sepo_ipd/lambdas_ipd/sepo_seed_{seed}") == "sepo_ipd_lambdas_ipd_sepo_seed"
    runs = [{"learned_exploit": v, "seconds": 60.0} for v in (0.2, 0.4, 0.6)]
    summary = summarise(runs)
    assert summary["n"] == 3 and "exact_exploit" not in summary  # a game without an exact value
    assert summary["learned_exploit"]["mean"] == pytest.approx(0.4)
    assert summary["learned_exploit"]["se"] == pytest.approx(0.2 / 3**0.5)


def test_learned_exploit_reads_a_plan_s_four_arms_and_pairs_them_seed_by_seed():
    from benchmarks.studies.learned_exploit import paired, plan_arms

    arms, sft = plan_arms(Path("/p/tiny_paper"), "auction")
    assert sft == "/p/tiny_paper/sft/ipd/sft_seed_{seed}"  # the auction starts from the multi-game SFT
    assert {a.label: a.victim for a in arms} == {
        "Base": "model",
        "SFT": sft,
        "SEPO": "/p/tiny_paper/sepo_auction/lambdas_auction/sepo_seed_{seed}",
        "payoff-only": "/p/tiny_paper/sepo_auction/lambdas_zero/sepo_seed_{seed}",
    }

    def arm(learned, pool):
        runs = zip((2, 0, 1), learned, pool)
        return {
            "runs": [
                {"train_seed": s, "learned_exploit": x, "pool_exploit": y, "pool_exploit_max": 2 * y}
                for s, x, y in runs
            ]
        }

    # payoff-only's runs listed in another order: differences pair by seed, not by position
    sepo, payoff_only = arm((0.1, 0.2, 0.3), (0.0, 0.0, 0.0)), arm((0.3, 0.7, 0.2), (1.0, 2.0, 3.0))
    payoff_only["runs"].reverse()
    out = paired({"SEPO": sepo, "payoff-only": payoff_only})
    assert set(out) == {"SEPO − payoff-only"}  # no SFT arm, no SEPO − SFT
    assert out["SEPO − payoff-only"]["learned_exploit"]["mean"] == pytest.approx(
        ((0.1 - 0.3) + (0.2 - 0.7) + (0.3 - 0.2)) / 3
    )
    assert out["SEPO − payoff-only"]["pool_exploit"]["mean"] == pytest.approx(-2.0)
    assert out["SEPO − payoff-only"]["pool_exploit_max"]["mean"] == pytest.approx(-4.0)


def test_learned_exploit_reports_a_campaign_s_archived_runs_without_training_the_rest(tmp_path, monkeypatch):
    from benchmarks.studies import learned_exploit

    def started(*_args, **_kwargs):
        raise AssertionError("--archived trains nothing")

    monkeypatch.setattr(learned_exploit.subprocess, "call", started)
    archive = tmp_path / "archive"
    done = {("Base", 0): 0.0, ("SFT", 0): 0.8, ("SFT", 1): 0.6, ("SEPO", 1): 0.5}
    for (arm, seed), learned in done.items():
        run = {"learned_exploit": learned, "pool_exploit": 0.3, "pool_exploit_max": 0.6, "train_seed": seed}
        (archive / "ipd" / arm).mkdir(parents=True, exist_ok=True)
        (archive / "ipd" / arm / f"seed_{seed}.json").write_text(json.dumps({**run, "seconds": 300.0}))
    out = tmp_path / "report.json"
    argv = ["--plan", str(tmp_path / "tiny_paper"), "--games", "ipd,kuhn", "--seeds", "0,1", "--root"]
    argv += [str(tmp_path / "runs"), "--archive", str(archive), "--archived", "--out", str(out)]
    assert learned_exploit.main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report["games"]) == ["ipd"]  # Kuhn has no run yet
    arms = report["games"]["ipd"]["arms"]
    assert {arm: a["n"] for arm, a in arms.items()} == {"Base": 1, "SFT": 2, "SEPO": 1}  # payoff-only has none
    assert arms["SFT"]["learned_exploit"]["mean"] == pytest.approx(0.7)
    # SEPO − SFT pairs the one seed both have: 0.5 − 0.6
    assert report["games"]["ipd"]["paired"]["SEPO − SFT"]["learned_exploit"]["mean"] == pytest.approx(-0.1)
