"""SEPO on the tiny model: the penalty-mode gradients, stream independence, skipping, resume."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from sepo.builders import load_model_and_tokenizer
from sepo.errors import Diverged
from sepo.games import make_game
from sepo.policies.lm import LMPolicy
from sepo.policies.recording import RecordingPolicy
from sepo.stages.sepo_loop import attach_lora, update
from sepo.training.objective import EstimatorState, sepo_settings
from sepo.training.passes import reference_logprobs
from sepo.training.rollouts import BatchBuilder
from sepo.training.update import accumulate_gradients

from .conftest import SMALL, LogTracker, final_adapter, run_dirs, wandb_cli


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
        model = attach_lora(base, cfg.model.lora.target_modules, s.lora.r, s.lora.alpha, float(s.lora.dropout))
        with torch.no_grad():  # a non-zero adapter, so every LoRA weight gets a gradient
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
        policy = LMPolicy(
            model, tok, cfg.model, temperature=float(s.temperature), max_new_tokens=int(s.max_new_tokens), seed=0
        )
        return cfg, s, make_game(cfg.game), model, policy

    return _setup


def collect(cfg, s, game, policy, batch_index=0):
    return BatchBuilder(cfg, s).collect(game, RecordingPolicy(policy), batch_index, EstimatorState())


def train_trace(batch):
    return [
        [(ep.rounds[t].actions, d.text, d.tokens.gen_ids.tolist()) for t, (_, _, d) in enumerate(ep.trace)]
        for g in batch.groups
        if g.pool == "train"
        for ep in g.records
    ]


def test_pooled_trains_on_every_pool_and_the_paper_modes_on_the_train_pool_only(setup):
    batches = {}
    for mode in ("pooled", "per_rollout", "shared"):
        cfg, s, game, model, policy = setup(f"sepo.penalty_mode={mode}")
        batches[mode] = collect(cfg, s, game, policy)
    pools = {mode: sorted({g.pool for g in b.groups}) for mode, b in batches.items()}
    assert pools == {"pooled": ["collusive", "exploit", "train"], "per_rollout": ["train"], "shared": ["train"]}
    pooled = batches["pooled"]
    assert (
        len(pooled.decisions) == sum(len(ep.trace) for g in pooled.groups for ep in g.records) == len(pooled.advantages)
    )
    # the train groups are the same episodes in every mode (one seed, one stream family per group)
    assert train_trace(batches["pooled"]) == train_trace(batches["per_rollout"]) == train_trace(batches["shared"])


@pytest.mark.parametrize(
    "passes",
    [
        ["sepo.micro_batch=5"],
        ["sepo.micro_batch_tokens=400"],
        ["sepo.micro_batch_tokens=400", "model.prefix_tree=true"],
    ],
)
def test_the_loss_gradient_is_the_advantage_weighted_score(setup, passes):
    """At ratio 1 (a fresh batch) and beta 0, the step is sum_d A_d * grad(token mean of log pi_d): the
    gradient the estimator's advantages were built for, whatever the passes (by decisions, by tokens, or
    as prefix trees; the direct computation below is one padded pass)."""
    from sepo.training.passes import pass_layout, policy_logprobs

    cfg, s, game, model, policy = setup("sepo.beta=0", *passes)
    batch = collect(cfg, s, game, policy)
    assert len(pass_layout(policy, batch.decisions, s)) > 1, "the setting must split the batch into several passes"
    batch.advantages = torch.randn(len(batch.decisions), generator=torch.Generator().manual_seed(0)).numpy()
    model.zero_grad()
    accumulate_gradients(model, policy, batch, reference_logprobs(model, policy, batch, s), s)
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    model.zero_grad()
    model.train()
    policy.prefix_tree = False  # one padded pass
    lp, mask = policy_logprobs(model, policy, batch.decisions, s)
    per_decision = (lp * mask).sum(dim=1) / mask.sum(dim=1)
    (-(torch.tensor(batch.advantages, dtype=lp.dtype) * per_decision).sum()).backward()
    model.eval()
    direct = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all(torch.allclose(ours[k], direct[k], atol=1e-6, rtol=1e-3) for k in ours)
    assert any(v.abs().sum() > 0 for v in ours.values())


def test_passes_hold_at_most_micro_batch_decisions_and_micro_batch_tokens():
    """Every decision in exactly one pass; no pass over either cap, except a row longer than the token cap,
    which is a pass of its own."""
    from types import SimpleNamespace

    from sepo.training.passes import micro_batches

    lengths = [30, 10, 50, 20, 120, 40, 10, 60]
    decisions = [SimpleNamespace(tokens=SimpleNamespace(prompt_ids=[0] * (n - 5), gen_ids=[0] * 5)) for n in lengths]
    passes = micro_batches(decisions, 3, 100)
    assert sorted(i for p in passes for i in p) == list(range(len(lengths)))
    for p in passes:
        widest = max(lengths[i] for i in p)
        assert len(p) <= 3
        assert len(p) * widest <= 100 or len(p) == 1, (p, widest)
    assert [[lengths[i] for i in p] for p in passes] == [[10, 10, 20], [30, 40], [50], [60], [120]]
    # no token cap: passes of micro_batch rows, shortest first
    assert [len(p) for p in micro_batches(decisions, 3, 0)] == [3, 3, 2]

    # a prefix of 8 tokens every prompt shares is encoded once per pass: a pass counts it once, then its
    # rows' own tokens (padded to the longest), so more rows fit under the same cap
    passes = micro_batches(decisions, 3, 100, shared=8)
    for p in passes:
        widest = max(lengths[i] for i in p)
        assert 8 + len(p) * (widest - 8) <= 100 or len(p) == 1, (p, widest)
    assert [[lengths[i] for i in p] for p in passes] == [[10, 10, 20], [30, 40], [50], [60], [120]]
    assert [[lengths[i] for i in p] for p in micro_batches(decisions, 8, 100, shared=8)] == [
        [10, 10, 20, 30],
        [40, 50],
        [60],
        [120],
    ]
    assert [[lengths[i] for i in p] for p in micro_batches(decisions, 8, 100)] == [
        [10, 10, 20],
        [30, 40],
        [50],
        [60],
        [120],
    ]


def test_passes_without_gradients_take_their_own_token_cap_and_count_the_shared_prefix_once():
    """The KL check after an update keeps no activations: `sepo.no_grad_micro_batch_tokens` sets its passes'
    cap (0: `micro_batch_tokens`); every pass counts the prefix all prompts share once (the policy's
    `shared_prefix_length`)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from sepo.training.passes import pass_layout

    rules = list(range(100, 140))  # 40 shared tokens, then 10 of each row's own, then a 5-token answer
    decisions = [
        SimpleNamespace(tokens=SimpleNamespace(prompt_ids=torch.tensor(rules + [i] * 10), gen_ids=torch.zeros(5)))
        for i in range(12)
    ]
    policy = SimpleNamespace(shared_prefix_length=lambda prompts: 40, prefix_tree=False)
    s = OmegaConf.create({"micro_batch": 32, "micro_batch_tokens": 100, "no_grad_micro_batch_tokens": 0})
    assert [len(p) for p in pass_layout(policy, decisions, s)] == [4, 4, 4]  # 40 + 4 x 15 = 100
    assert [len(p) for p in pass_layout(policy, decisions, s, grad=False)] == [4, 4, 4]
    s.no_grad_micro_batch_tokens = 220  # 40 + 12 x 15
    assert [len(p) for p in pass_layout(policy, decisions, s, grad=False)] == [12]
    assert [len(p) for p in pass_layout(policy, decisions, s)] == [4, 4, 4]


@pytest.mark.parametrize("tree", [False, True])
def test_the_reference_is_scored_in_the_update_s_passes_so_a_fresh_adapter_has_a_kl_of_exactly_zero(setup, tree):
    """With the adapter fresh (B = 0) the policy is the reference, and the clipped KL term must be 0, not
    rounding: the reference takes the update's passes even where passes without gradients may be wider
    (`sepo.no_grad_micro_batch_tokens`), since a pass rounds by its layout and the clip keeps the noise."""
    from sepo.training.passes import pass_layout, policy_logprobs, shared_root

    cfg, s, game, model, policy = setup(
        "sepo.micro_batch=64",
        "sepo.micro_batch_tokens=300",
        "sepo.no_grad_micro_batch_tokens=100000",
        f"model.prefix_tree={tree}",
    )
    batch = collect(cfg, s, game, policy)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    assert len(pass_layout(policy, batch.decisions, s)) > len(pass_layout(policy, batch.decisions, s, grad=False)) == 1
    ref = reference_logprobs(model, policy, batch, s)
    stats = accumulate_gradients(model, policy, batch, ref, s)
    assert stats["kl_ref"] == 0.0
    with torch.no_grad():  # the wider layout does round otherwise: the floor this avoids
        wide, _ = policy_logprobs(model, policy, batch.decisions, s, shared_root(model, policy, batch.decisions))
    assert any(not torch.equal(wide[i][: len(r)], r) for i, r in enumerate(ref))


def test_a_non_finite_loss_takes_no_step_and_ends_the_run_as_diverged(setup, monkeypatch):
    cfg, s, game, model, policy = setup()
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch.advantages[0] = float("nan")
    with pytest.raises(Diverged) as err:
        update(model, policy, opt, batch, ref, s, step=0)
    line = str(err.value)  # the pass, and what in it was not finite: the one line a remote run leaves
    assert line.startswith("diverged at step 1: the loss of pass ")
    assert "is nan: log-probs non-finite at 0 of " in line
    assert "sampler's log-probs 0; reference log-probs 0; advantages 1 of " in line
    assert line.endswith("; the checkpoints before it are kept")
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if p.requires_grad)


def test_a_non_finite_gradient_behind_a_finite_loss_names_the_parameter(setup):
    cfg, s, game, model, policy = setup()
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    name, param = next((n, p) for n, p in model.named_parameters() if p.requires_grad)
    param.register_hook(lambda grad: grad * float("inf"))  # an overflow in the backward pass alone
    with pytest.raises(Diverged) as err:
        update(model, policy, opt, batch, ref, s, step=3)
    line = str(err.value)  # the first pass whose backward made it so, and what that pass's inputs held
    assert line.startswith("diverged at step 4: pass 1 of ")
    assert f"positions) made the gradient of {name} non-finite, its loss " in line
    assert ": log-probs non-finite at 0 of " in line and " and 0 of " in line and "; advantages 0 of " in line
    assert line.endswith("; the checkpoints before it are kept")
    assert all(p.grad is None for p in model.parameters())  # no step, nothing left to leak into the next


def nan_in_the_backward_alone(module, _args, output):
    """Adds exactly 0 to the layer's output in the forward, and NaN in the backward: z * sqrt(z) at z = 0
    has SqrtBackward0 divide 0 by 0."""
    hidden = output[0] if isinstance(output, tuple) else output
    zero = hidden.float().sum() * 0
    hidden = hidden + (zero * torch.sqrt(zero)).to(hidden.dtype)
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


@pytest.mark.parametrize("anomaly", [False, True])
def test_a_nan_made_in_the_backward_is_named_by_its_pass_or_in_anomaly_mode_by_its_operation(setup, anomaly):
    cfg, s, game, model, policy = setup()
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0"))
    layer.register_forward_hook(nan_in_the_backward_alone)
    s.debug_detect_anomaly = anomaly
    if anomaly:
        with pytest.raises(RuntimeError, match="Function 'SqrtBackward0' returned nan values"):
            update(model, policy, opt, batch, ref, s, step=0)
        assert not torch.is_anomaly_enabled()  # only for the update's passes
    else:
        with pytest.raises(Diverged, match="diverged at step 1: pass 1 of .* made the gradient of .* non-finite"):
            update(model, policy, opt, batch, ref, s, step=0)


def test_ref_4bit_without_cuda_is_a_clear_error(cli):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = cli(*SMALL, "sepo.ref_4bit=true", "logger=none")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "sepo.ref_4bit=true needs a CUDA device" in proc.stderr


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_uninterrupted_weights(cli, tmp_path):
    args = [
        *SMALL,
        "sepo.steps=4",
        "sepo.checkpoint_steps=[2]",
        "sepo.refresh_steps=2",
        "logger=wandb",
        "sepo.lr_schedule=cosine",
        "sepo.lr=1e-3",
    ]  # the decayed rate must resume where it was
    proc = cli(*args, "paths.root_dir=" + str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (straight,) = run_dirs(tmp_path / "a", "DONE")

    killed = cli(*args, "sepo.debug_kill_after_step=3", "paths.root_dir=" + str(tmp_path / "b"))
    assert killed.returncode == -9
    (run,) = [p.parent for p in (tmp_path / "b" / "outputs").rglob("latest")]
    run = run.parent
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert not (run / "DONE").exists()
    resumed = cli(*args, "paths.root_dir=" + str(tmp_path / "b"))  # the same run dir: the debug key names no run
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr + resumed.stdout

    a, b = final_adapter(straight), final_adapter(run)
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    for step in (2, 4):
        results = json.loads((straight / "eval" / f"step_{step}" / "results.json").read_text())
        assert results["stage"] == "sepo"
        assert results["step"] == step
    assert json.loads((straight / "eval" / "step_4" / "results.json").read_text())["checkpoint"] == "final"

    # per-step training metrics reached W&B (offline) and read back
    (wandb_dir,) = list((straight / "wandb").glob("offline-run-*"))

    out = subprocess.run(
        [wandb_cli(), "leet", "inspect", "--json", str(wandb_dir)], capture_output=True, text=True, check=True
    ).stdout
    history = [json.loads(line)["history"]["item"] for line in out.splitlines() if '"type":"history"' in line]
    steps = [h for h in history if "sepo/objective" in h]
    assert [h["step"] for h in steps] == [1, 2, 3, 4]
    assert [h["sepo/lr"] for h in steps] == pytest.approx([1e-3, 0.75e-3, 0.25e-3, 0.0])  # cosine over 4 updates
    for key in (
        "sepo/kl_ref",
        "sepo/clip_fraction",
        "sepo/parse_rate",
        "sepo/train/u",
        "sepo/exploit/e",
        "sepo/collusive/c",
        "sepo/train/x",
        "sepo/tokens_generated",
        "sepo/seconds_per_step",
        "sepo/adv_scale",
        "sepo/exploit_on/AlwaysD",
    ):
        assert key in steps[0], key
    assert any("eval/safety" in h for h in history)


@pytest.mark.slow
def test_a_damaged_checkpoint_falls_back_to_the_one_before_it(cli, tmp_path):
    """The latest checkpoint's adapter truncated to half: the re-run says so in one log line naming its
    path, resumes from the checkpoint before, and ends with the uninterrupted run's weights."""
    args = [*SMALL, "sepo.steps=3", "sepo.checkpoint_steps=[1,2]", "sepo.refresh_steps=1", "logger=none"]
    straight = cli(*args, "paths.root_dir=" + str(tmp_path / "a"))
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = cli(*args, "sepo.debug_kill_after_step=2", "paths.root_dir=" + str(tmp_path / "b"))
    assert killed.returncode == -9
    (run,) = [p.parent.parent for p in (tmp_path / "b" / "outputs").rglob("latest")]
    adapter = run / "checkpoints" / "step_2" / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[: adapter.stat().st_size // 2])
    assert not list((run / "checkpoints").glob(".*tmp"))  # every checkpoint was renamed into place whole

    resumed = cli(*args, "paths.root_dir=" + str(tmp_path / "b"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert f"checkpoint {run / 'checkpoints' / 'step_2'} does not load" in log
    assert "step_1 (step 1)" in log
    (a,) = [final_adapter(r) for r in run_dirs(tmp_path / "a", "DONE")]
    b = final_adapter(run)
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_the_importance_ratio_is_one_on_a_fresh_batch(setup):
    """LoRA dropout 0 (the SEPO default): the training pass scores the sampled tokens exactly as sampling did."""
    from sepo.training.passes import pad_rows, policy_logprobs

    def ratios(*overrides):
        cfg, s, game, model, policy = setup(*overrides)
        batch = collect(cfg, s, game, policy)
        decisions = batch.decisions[:16]
        model.train()
        with torch.no_grad():
            lp, mask = policy_logprobs(model, policy, decisions, s)
        model.eval()
        old = pad_rows([d.tokens.logprobs for d in decisions], lp.shape[1])
        return torch.exp(lp - old)[mask.bool()]

    assert (ratios() - 1).abs().max() < 1e-4
    assert (ratios("sepo.lora.dropout=0.05") - 1).abs().max() > 1e-3  # why dropout must be off


def test_a_folded_adapter_plays_the_adapted_policy_and_leaves_the_weights_as_they_were(setup):
    """Checkpoint evaluations and best-response reads fold the adapter into the weights (W + scale * B @ A):
    the same logits as through the adapter (tiny runs in float32), no adapter pass inside, and on exit the
    very same weight tensors, bit for bit, so the reference (adapter off) is still the SFT model."""
    from sepo.models import adapter_folded

    cfg, s, game, model, policy = setup()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    adapted = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "get_base_layer")]
    weights = [(m.get_base_layer().weight, m.get_base_layer().weight.detach().clone()) for m in adapted]
    with torch.no_grad():
        through_adapter = model(input_ids=ids).logits
        with model.disable_adapter():
            reference = model(input_ids=ids).logits
        with adapter_folded(model) as folded:
            assert all(not torch.equal(m.get_base_layer().weight, w) for m, (_, w) in zip(adapted, weights))
            calls = []
            hooks = [m.lora_A.default.register_forward_hook(lambda *a: calls.append(1)) for m in adapted]
            folded_logits = folded(input_ids=ids).logits
            for h in hooks:
                h.remove()
        assert not calls  # the adapter's own products do not run
        assert (folded_logits - through_adapter).abs().max() < 1e-4
        assert (through_adapter - reference).abs().max() > 1e-3  # the adapter does change the policy
        for m, (tensor, value) in zip(adapted, weights):
            assert m.get_base_layer().weight is tensor and torch.equal(tensor, value)
        assert torch.equal(model(input_ids=ids).logits, through_adapter)
        with adapter_folded(model, enabled=False):  # sepo.fold_adapter_for_reads=false
            assert torch.equal(model(input_ids=ids).logits, through_adapter)


def test_fallback_decisions_are_trained_on_the_tokens_the_policy_sampled(setup):
    cfg, s, game, model, policy = setup()
    batch = collect(cfg, s, game, policy)
    fallbacks = [d for d in batch.decisions if d.tokens.fallback]
    assert fallbacks, "the untrained tiny model should need the fallback (4 new tokens)"
    requests = {id(d): req for g in batch.groups for ep in g.records for _, req, d in ep.trace}
    for d in fallbacks:
        assert policy.tokenizer.decode(d.tokens.gen_ids.tolist(), skip_special_tokens=True) == d.text
        assert d.tokens.prompt_ids.tolist() == policy.render(requests[id(d)].messages)  # not the re-ask prompt
        assert len(d.tokens.logprobs) == len(d.tokens.gen_ids)
        assert not d.parsed


def test_beta_zero_skips_the_reference_pass_and_changes_nothing_else(setup, monkeypatch):
    """The reference log-probs only feed the KL term: with beta = 0 the pass is skipped and the
    update is the same as with the reference present (its KL term weighs 0)."""
    cfg, s, game, model, policy = setup("sepo.beta=0")
    batch = collect(cfg, s, game, policy)
    calls = []
    monkeypatch.setattr(model, "disable_adapter", lambda: calls.append(1))
    assert reference_logprobs(model, policy, batch, s) is None
    assert not calls
    monkeypatch.undo()
    grads = []
    for ref in (None, reference_logprobs(model, policy, batch, OmegaConf.merge(s, {"beta": 0.01}))):
        model.zero_grad()
        stats = accumulate_gradients(model, policy, batch, ref, s)
        assert ("kl_ref" in stats) == (ref is not None)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("refresh_kl, batches", [(1e9, 1), (0.0, 2)])
def test_refresh_is_decided_on_the_kl_after_the_update(compose_cfg, tiny_cache, monkeypatch, refresh_kl, batches):
    from sepo.stages.sepo_loop import run_sepo
    from sepo.training.rollouts import BatchBuilder

    calls = []
    collect_batch = BatchBuilder.collect
    monkeypatch.setattr(BatchBuilder, "collect", lambda self, *a: calls.append(a[2]) or collect_batch(self, *a))
    cfg = compose_cfg(
        *SMALL,
        f"paths.cache_dir={tiny_cache}",
        "sepo.steps=2",
        "sepo.checkpoint_steps=[]",
        "sepo.refresh_steps=5",
        f"sepo.refresh_kl={refresh_kl}",
        "sepo.lr=1e-2",
    )
    tracker = LogTracker()
    run_sepo(cfg, tracker)
    assert calls == list(range(batches))  # 2 steps on one batch, or a fresh batch after the first step
    steps = {step: row for step, row in tracker.rows if "sepo/loss" in row}
    assert sorted(steps) == [1, 2]
    assert steps[1]["sepo/kl_old_after"] > 0  # measured with the updated parameters (0 before the step)
    assert "sepo/kl_old_after" not in steps[2]  # the last step decides nothing


def test_step_benchmark_reports_a_breakdown_that_adds_up(tmp_path):
    """`python -m benchmarks step`: the sections partition the measured wall time of a step."""
    import os
    import sys

    from .conftest import ROOT

    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "step",
            "--steps",
            "1",
            "--threads",
            "1",
            "game.rounds=2",
            "game.pools.train=[TFT]",
            "game.pools.exploit=[AlwaysD]",
            "game.pools.collusive=[AlwaysC]",
            "sepo.max_new_tokens=4",
            "sepo.rollouts_per_opponent=2",
            "sepo.refresh_steps=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["decisions"] == 3 * 2 * 2  # three pools of one opponent, n = 2, two rounds: all trained
    assert result["tokens"] > 0
    assert result["seconds_per_step"] > 0
    parts = result["breakdown"]
    assert {"prompt_processing", "decoding", "sampling", "stopping", "reference_logprobs", "backward"} <= set(parts)
    # a partition, not a timing tolerance: the exclusive sections and what none claimed add up to the
    # wall time (to the rounding of each line to 1 ms), and no section claims more than the wall time
    assert sum(parts.values()) == pytest.approx(result["seconds_per_step"], abs=0.0005 * len(parts))
    assert parts["unaccounted"] >= -0.0005
    # the work beside the machine's matmul rate: the update re-runs the reference's rows (one batch, one
    # packing), and its backward carries as much matmul work as its forward (LoRA: the base is frozen)
    work = result["gflop_per_step"]
    assert work["update_forward"] == work["reference_logprobs"] == work["backward"] > 0
    assert result["matmul_gflops"] > 0
    assert set(result["share_of_matmul"]) <= set(parts)


def test_a_rollout_batch_played_by_forked_workers_is_the_batch_played_whole(setup):
    """`model.cpu_workers`: the rollouts' episodes, their traces (tokens, behaviour log-probs) and so the
    batch's advantages are the same whether one process plays them or two forked ones share them. The
    log-probs agree to float32 rounding only: a worker's smaller batch sums in another order on some CPUs."""
    cfg, s, game, model, policy = setup()
    whole = collect(cfg, s, game, policy)
    policy.workers = 2
    split = collect(cfg, s, game, policy)
    assert train_trace(split) == train_trace(whole)
    assert len(split.decisions) == len(whole.decisions)
    for a, b in zip(split.decisions, whole.decisions):
        assert torch.equal(a.tokens.gen_ids, b.tokens.gen_ids)
        torch.testing.assert_close(a.tokens.logprobs, b.tokens.logprobs, rtol=1e-5, atol=1e-5)
    assert split.advantages.tolist() == whole.advantages.tolist()


def test_sgd_steps_along_the_gradient_itself(setup):
    """sepo.optimizer=sgd (momentum 0): the step is -lr times the (clipped) gradient, coordinate for coordinate;
    AdamW's first step is about the sign of each coordinate instead."""
    from sepo.stages.sepo_loop import make_optimizer

    cfg, s, game, model, policy = setup("sepo.optimizer=sgd", "sepo.lr=0.5", "sepo.grad_clip=1e9")
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, s)
    assert isinstance(opt, torch.optim.SGD)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = None
    accumulate_gradients(model, policy, batch, ref, s)
    grads = [p.grad.detach().clone() for p in params]
    with torch.no_grad():
        for p, p0 in zip(params, before):
            p.copy_(p0)
    update(model, policy, opt, batch, ref, s, step=0)
    lr = float(opt.param_groups[0]["lr"])  # the schedule's rate at step 0
    for p, p0, g in zip(params, before, grads):
        torch.testing.assert_close(p.detach(), p0 - lr * g, rtol=1e-4, atol=1e-7)


def test_the_line_search_stops_scoring_a_step_once_its_kl_is_past_the_limit(setup, monkeypatch):
    """`policy_change(kl_limit=)`: a limit above the step's KL reads the whole batch, exactly as without one; a limit
    below it stops after fewer passes with a KL still past the limit (each token's KL term is non-negative), so the
    line search's verdict is the same and only its cost changes."""
    from sepo.training import update as update_module

    cfg, s, game, model, policy = setup("sepo.micro_batch=2")
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    before: list[torch.Tensor] = []
    accumulate_gradients(model, policy, batch, ref, s, before)
    with torch.no_grad():  # a step of the adapter, as the optimizer's would be
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    scored = []
    passes = update_module.scored_passes

    def counted_passes(*args, **kwargs):
        for scored_pass in passes(*args, **kwargs):
            scored.append(scored_pass[0])
            yield scored_pass

    monkeypatch.setattr(update_module, "scored_passes", counted_passes)

    def change(limit):
        scored.clear()
        out = update_module.policy_change(model, policy, batch, s, before, batch.advantages, kl_limit=limit)
        return out, len(scored)

    (kl, gain), whole = change(float("inf"))
    assert whole == -(-len(batch.decisions) // 2) and kl > 0
    assert change(2 * kl) == ((kl, gain), whole)
    (kl_cut, _), cut = change(kl / 4)
    assert cut < whole and kl / 4 < kl_cut <= kl


@pytest.mark.parametrize("limit", [1e9, 1e-12])
def test_the_trust_region_keeps_a_step_within_its_kl_or_undoes_it(setup, limit):
    """With a limit no step reaches, the step is the optimizer's whole step; with one every step passes, it is
    halved line_search_steps times and then undone: the parameters and the optimizer's moments as before."""
    cfg, s, game, model, policy = setup(f"sepo.trust_region_kl={limit}", "sepo.line_search_steps=2", "sepo.lr=1e-2")
    batch = collect(cfg, s, game, policy)
    ref = reference_logprobs(model, policy, batch, s)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    before = [p.detach().clone() for p in params]
    stats = update(model, policy, opt, batch, ref, s, step=0)
    moved = any(not torch.equal(p, p0) for p, p0 in zip(params, before))
    if limit > 1:
        assert stats["step_fraction"] in (1.0, 0.5, 0.25, 0.0)  # a negative surrogate gain can still shrink it
        assert moved == (stats["step_fraction"] > 0)
        if stats["step_fraction"] > 0:
            assert 0 < stats["kl_step"] <= limit and stats["surrogate_gain"] >= 0
    else:
        assert stats["step_fraction"] == 0.0 and not moved
        assert all(not opt.state[p] for p in params)  # the optimizer's state is as before its first step
