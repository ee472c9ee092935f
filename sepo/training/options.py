"""The named options of the SEPO stage (docs/spec.md §4), apart from the code that implements them, so
the config check can list them before any work without importing torch."""

from sepo import penalties

#: sepo.penalty_mode: pooled (the gradient of J) | per_rollout (the paper's text) | shared (its Algorithm 1)
PENALTY_MODES = ("pooled", "per_rollout", "shared")
#: sepo.credit: what a decision is credited with (the rest of the episode, or its own round)
CREDITS = ("return_to_go", "round")
#: sepo.adv_norm: one scale for the whole batch, or the paper's per-group-and-round standardisation
ADV_NORMS = ("batch", "group_round")
#: sepo.length_norm: what divides each answer's summed token terms (its own length, or the generation budget)
LENGTH_NORMS = ("answer", "budget")
#: sepo.lr_schedule: how the learning rate goes from sepo.lr to sepo.lr_final_ratio * sepo.lr
LR_SCHEDULES = ("constant", "cosine", "linear")


def rollouts_per_group(s) -> dict[str, int]:
    """Each trained pool's rollouts per group: its `sepo.rollouts_by_pool` entry, else `rollouts_per_opponent`.
    A pool's term is averaged over its own groups, so a pool given more keeps the same expected gradient with
    less noise."""
    return {pool: s.rollouts_by_pool.get(pool) or s.rollouts_per_opponent for pool in penalties.trained_pools()}


#: exploiter.objective: what a learned exploiter is rewarded with per round: the exploit term's own quantity (its
#: payoff minus the victim's, what its learned exploitability reads) or its own payoff alone
EXPLOITER_OBJECTIVES = ("advantage", "payoff")

#: sepo.estimator: advantages from played episodes, or (Kuhn poker) exact values of the sampled actions
ESTIMATORS = ("rollouts", "exact_values")
#: the games whose rules and pools `sepo.estimator=exact_values` can value exactly
EXACT_VALUE_GAMES = ("kuhn",)
