"""Exact analysis of Kuhn poker (docs/spec.md §6): exploitability and expected values.

A policy is read at Kuhn's 12 information sets: the player's card (J, Q, K) times its public
history: '' (first player to open), 'p' (second player after PASS), 'b' (second player facing a
BET), 'pb' (first player facing a BET after its PASS). The keys are OpenSpiel's information-state
strings ("0", "1p", "2pb", ... with card 0 = J), and each entry is the probability pair
(pass-or-fold, bet-or-call), OpenSpiel's action order, so a table converts to an OpenSpiel
`TabularPolicy` one to one and the tests can check these numbers against OpenSpiel.

Exploitability is NashConv/2: the mean over the two seats of a best response's value against the
policy playing the other seat. The game is zero-sum and the policy plays both seats, so its own
values cancel. A best responder's information set is (own card, public history), so its value is a
max over actions of the counterfactual value: the sum over the opponent's possible cards of chance
probability x the opponent's reach probability x payoff.
"""

from __future__ import annotations

import numpy as np

CARDS = (0, 1, 2)
HISTORIES = ("", "p", "b", "pb")
TERMINALS = ("pp", "pbp", "pbb", "bp", "bb")
INFOSETS = tuple(f"{c}{h}" for c in CARDS for h in HISTORIES)

Table = dict[str, np.ndarray]


def seat_to_move(history: str) -> int:
    return len(history) % 2


def first_seat_payoff(history: str, first_card: int, second_card: int, ante: float = 1.0, bet: float = 1.0) -> float:
    """The first player's chips at terminal `history` (OpenSpiel letters: p = pass/fold, b = bet/call).

    Each player has put in the ante, plus the bet if it bet or called; a fold loses what the folder
    put in, a showdown wins what the loser put in (with ante 1 and bet 1: +-1 or +-2).
    """
    put = [ante, ante]
    for i, a in enumerate(history):
        if a == "b":
            put[i % 2] += bet
    if history.endswith("bp"):  # the player facing the bet folded
        folder = (len(history) - 1) % 2
        return put[1] if folder == 1 else -put[0]
    return put[1] if first_card > second_card else -put[0]


def check_table(table: Table) -> Table:
    missing = [k for k in INFOSETS if k not in table]
    if missing:
        raise ValueError(f"policy table misses information sets {missing}")
    return table


def _br_value(
    table: Table, br_seat: int, history: str, card: int, weights: dict[int, float], ante: float, bet: float
) -> float:
    """Counterfactual value for the best responder holding `card` at `history`.

    `weights[o]` is chance x opponent reach probability of the opponent holding `o`.
    """
    if history in TERMINALS:
        sign = 1.0 if br_seat == 0 else -1.0
        return sum(
            w * sign * first_seat_payoff(history, *((card, o) if br_seat == 0 else (o, card)), ante, bet)
            for o, w in weights.items()
        )
    if seat_to_move(history) == br_seat:
        return max(_br_value(table, br_seat, history + a, card, weights, ante, bet) for a in "pb")
    return sum(
        _br_value(
            table, br_seat, history + a, card, {o: w * table[f"{o}{history}"][i] for o, w in weights.items()}, ante, bet
        )
        for i, a in enumerate("pb")
    )


def best_response_value(table: Table, br_seat: int, ante: float = 1.0, bet: float = 1.0) -> float:
    """Expected value of a best response in seat `br_seat` (0 = first) against `table` in the other."""
    check_table(table)
    total = 0.0
    for card in CARDS:
        others = [o for o in CARDS if o != card]
        weights = {o: 1.0 / (len(CARDS) * len(others)) for o in others}
        total += _br_value(table, br_seat, "", card, weights, ante, bet)
    return total


def nash_conv(table: Table, ante: float = 1.0, bet: float = 1.0) -> float:
    """Sum over seats of best-response gains when `table` plays both seats (its own values cancel)."""
    return best_response_value(table, 0, ante, bet) + best_response_value(table, 1, ante, bet)


def exploitability(table: Table, ante: float = 1.0, bet: float = 1.0) -> float:
    """NashConv/2, as OpenSpiel's `exploitability.exploitability` for a two-player zero-sum game."""
    return nash_conv(table, ante, bet) / 2.0


def best_response_table(table: Table, ante: float = 1.0, bet: float = 1.0) -> Table:
    """The pure best response to `table`, in both seats, as a 12-entry table (OpenSpiel's layout).

    Seat 0's information sets are the histories '' and 'pb', seat 1's are 'p' and 'b', so one table
    holds the best response of each seat against `table` playing the other. At each information
    set the action with the larger counterfactual value is taken, PASS/FOLD on a tie (within
    1e-12): the value is the same either way. Every information set gets an action, reached or not.
    Its value in seat s is `best_response_value(table, s)`, so its mean over the two seats is the
    exploitability of `table`.
    """
    check_table(table)
    out: Table = {}

    def walk(br_seat: int, history: str, card: int, weights: dict[int, float]) -> None:
        if history in TERMINALS:
            return
        if seat_to_move(history) == br_seat:
            values = [_br_value(table, br_seat, history + a, card, weights, ante, bet) for a in "pb"]
            out[f"{card}{history}"] = np.array([0.0, 1.0]) if values[1] > values[0] + 1e-12 else np.array([1.0, 0.0])
            for a in "pb":
                walk(br_seat, history + a, card, weights)
        else:
            for i, a in enumerate("pb"):
                walk(br_seat, history + a, card, {o: w * table[f"{o}{history}"][i] for o, w in weights.items()})

    for br_seat in (0, 1):
        for card in CARDS:
            others = [o for o in CARDS if o != card]
            walk(br_seat, "", card, {o: 1.0 / (len(CARDS) * len(others)) for o in others})
    return check_table(out)


def exploitability_se(
    table: Table, se: dict[str, float], ante: float = 1.0, bet: float = 1.0, step: float = 1e-6
) -> float:
    """Standard error of `exploitability(table)` when each entry's bet/call probability carries the
    standard error `se[key]`, estimated independently per information set (delta method).

    Exploitability is piecewise linear in the table (a max over pure best responses), so its
    gradient is exact away from ties; at a tie the central difference averages the two slopes.
    The estimate of a convex function is biased upward by the noise (Jensen): about the SE, at most.
    """
    check_table(table)
    variance = 0.0
    for key in INFOSETS:
        if not se.get(key):
            continue
        q = float(table[key][1])
        lo, hi = max(0.0, q - step), min(1.0, q + step)
        values = []
        for x in (lo, hi):
            moved = dict(table)
            moved[key] = np.array([1.0 - x, x])
            values.append(exploitability(moved, ante, bet))
        variance += ((values[1] - values[0]) / (hi - lo) * float(se[key])) ** 2
    return float(np.sqrt(variance))


def game_value(first: Table, second: Table, ante: float = 1.0, bet: float = 1.0) -> float:
    """The first player's expected chips per hand when `first` plays the first seat, `second` the second."""
    check_table(first)
    check_table(second)

    def value(history: str, c1: int, c2: int) -> float:
        if history in TERMINALS:
            return first_seat_payoff(history, c1, c2, ante, bet)
        table, card = (first, c1) if seat_to_move(history) == 0 else (second, c2)
        p = table[f"{card}{history}"]
        return sum(p[i] * value(history + a, c1, c2) for i, a in enumerate("pb") if p[i] > 0)

    deals = [(c1, c2) for c1 in CARDS for c2 in CARDS if c1 != c2]
    return sum(value("", c1, c2) for c1, c2 in deals) / len(deals)


def seat_values(agent: Table, opponent: Table, ante: float = 1.0, bet: float = 1.0) -> dict[str, float]:
    """The agent's expected chips per hand in each seat, and their mean (an episode's seat mix)."""
    first = game_value(agent, opponent, ante, bet)
    second = -game_value(opponent, agent, ante, bet)
    return {"first": first, "second": second, "mean": (first + second) / 2.0}
