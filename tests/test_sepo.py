"""SEPO on the tiny model: the penalty-mode gradients, stream independence, skipping, resume."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from sepo.games import make_game
from sepo.models import load_model_and_tokenizer
from sepo.policies.lm import LMPolicy
from sepo.sepo import accumulate_gradients, attach_lora, collect_rollouts, optimisation_step, reference_logprobs, sepo_settings

from .conftest import run_dirs

#: a small but complete setting: short episodes keep the tiny model's prompts (and CPU time) short
SMALL = ["stage=sepo", "model=tiny", "game=ipd", "game.rounds=3", "game.pools.train=[TFT,Mixed]",
         "game.pools.exploit=[AlwaysD]", "game.pools.robust=[Random]", "sepo.max_new_tokens=4",
         "sepo.rollouts_per_opponent=3", "eval.max_new_tokens=4", "eval.episodes_per_opponent=2", "eval.progress=false"]


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_cache")


@pytest.fixture
def setup(compose_cfg, tiny_cache):
    def _setup(*overrides):
        cfg = compose_cfg(*SMALL, f"paths.cache_dir={tiny_cache}", *overrides)
        s = sepo_settings(cfg)
        torch.manual_seed(0)
        base, tok = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
        model = attach_lora(base, cfg.model.lora.target_modules, s.lora.r, s.lora.alpha, 0.0)
        with torch.no_grad():  # a non-zero adapter, so every LoRA weight gets a gradient
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
        policy = LMPolicy(model, tok, cfg.model, temperature=float(s.temperature), max_new_tokens=int(s.max_new_tokens),
                          seed=0)
        return cfg, s, make_game(cfg.game), model, policy
    return _setup


#: opponents whose own randomness makes rollouts differ even when the untrained agent always picks the
#: same action; beta 0 leaves only the policy-gradient term, the one the penalty modes act on
VARYING = ["game.pools.train=[Random]", "game.pools.exploit=[Random]", "sepo.beta=0"]


def gradient(setup, *overrides):
    cfg, s, game, model, policy = setup(*VARYING, *overrides)
    batch = collect_rollouts(game, policy, cfg, s, batch_index=0)
    model.zero_grad()
    accumulate_gradients(model, policy, batch, reference_logprobs(model, policy, batch, s), s)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return grads, batch


def train_trace(batch):
    return [[(ep.rounds[t].actions, d.text, d.extras["gen_ids"].tolist()) for t, (_, _, d) in enumerate(ep.trace)]
            for g in batch.groups if g.pool == "train" for ep in g.records]


def close(a, b):
    return all(torch.allclose(a[k], b[k], atol=1e-7, rtol=1e-5) for k in a)


def test_shared_penalty_gradient_equals_no_penalty_and_the_other_modes_differ(setup):
    none, none_batch = gradient(setup, "sepo.penalty_mode=shared", "lambdas.train={e:0,c:0,x:0}")
    shared, shared_batch = gradient(setup, "sepo.penalty_mode=shared")
    assert train_trace(none_batch) == train_trace(shared_batch)
    assert any(abs(a - b) > 1e-6 for g0, g1 in zip(none_batch.groups, shared_batch.groups)
               for a, b in zip(g0.rewards.ravel(), g1.rewards.ravel()))  # the penalty is in the reward
    assert close(none, shared)  # ... and cancels in the per-round normalisation
    assert any(v.abs().sum() > 0 for v in none.values())

    per_rollout, pr_batch = gradient(setup, "sepo.penalty_mode=per_rollout")
    per_rollout_none, _ = gradient(setup, "sepo.penalty_mode=per_rollout", "lambdas.train={e:0,c:0,x:0}")
    assert train_trace(pr_batch) == train_trace(none_batch)  # same seed, same training rollouts
    assert not close(per_rollout, per_rollout_none)

    pooled, pooled_batch = gradient(setup, "sepo.penalty_mode=pooled")
    pooled_none, _ = gradient(setup, "sepo.penalty_mode=pooled", "lambdas.train={e:0,c:0,x:0}")
    assert train_trace(pooled_batch) == train_trace(none_batch)
    assert not close(pooled, pooled_none)


def test_non_finite_loss_skips_the_update(setup, monkeypatch):
    cfg, s, game, model, policy = setup()
    batch = collect_rollouts(game, policy, cfg, s, 0)
    ref = reference_logprobs(model, policy, batch, s)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch.decisions[0] = (batch.decisions[0][0], float("nan"))
    stats = optimisation_step(model, policy, opt, batch, ref, s)
    assert stats["skipped"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if p.requires_grad)


def test_ref_4bit_without_cuda_is_a_clear_error(cli):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = cli(*SMALL, "sepo.ref_4bit=true", "logger=none")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "sepo.ref_4bit=true needs a CUDA device" in proc.stderr


def final_adapter(run):
    return load_file(run / "adapter" / "adapter_model.safetensors")


def test_sigkill_then_resume_ends_with_the_uninterrupted_weights(cli, tmp_path):
    args = [*SMALL, "sepo.steps=4", "sepo.checkpoint_steps=[2]", "sepo.refresh_steps=2", "logger=wandb"]
    proc = cli(*args, "paths.root_dir=" + str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (straight,) = run_dirs(tmp_path / "a", "DONE")

    killed = cli(*args, "sepo.debug_kill_after_step=3", "paths.root_dir=" + str(tmp_path / "b"))
    assert killed.returncode == -9
    (run,) = [p.parent for p in (tmp_path / "b" / "outputs").rglob("latest")]
    run = run.parent
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2" and not (run / "DONE").exists()
    resumed = cli(*args, "paths.root_dir=" + str(tmp_path / "b"))  # the same run dir: the debug key names no run
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr + resumed.stdout

    a, b = final_adapter(straight), final_adapter(run)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    for step in (2, 4):
        results = json.loads((straight / "eval" / f"step_{step}" / "results.json").read_text())
        assert results["stage"] == "sepo" and results["step"] == step
    assert json.loads((straight / "eval" / "step_4" / "results.json").read_text())["checkpoint"] == "final"

    # per-step training metrics reached W&B (offline) and read back
    (wandb_dir,) = list((straight / "wandb").glob("offline-run-*"))
    from .test_tracking import wandb_cli
    out = subprocess.run([wandb_cli(), "leet", "inspect", "--json", str(wandb_dir)], capture_output=True, text=True,
                         check=True).stdout
    history = [json.loads(line)["history"]["item"] for line in out.splitlines() if '"type":"history"' in line]
    steps = [h for h in history if "sepo/reward" in h]
    assert [h["step"] for h in steps] == [1, 2, 3, 4]
    for key in ("sepo/kl_ref", "sepo/clip_fraction", "sepo/parse_rate", "sepo/train/u", "sepo/exploit/e",
                "sepo/collusive/c", "sepo/train/x", "sepo/tokens_generated", "sepo/seconds_per_step"):
        assert key in steps[0], key
    assert any("eval/safety" in h for h in history)
