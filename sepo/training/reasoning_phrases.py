"""The phrasings of the SFT data's reasoning lines, per game and case (`sepo.training.reasoning` picks the case
and the phrasing; this module holds only the words). Templates never quote payoff numbers, so a config with
other payoffs keeps them true; `{field}`s are filled from what the explainer observed."""

from __future__ import annotations

#: a line for a case no explainer knows, or whose rule implies another action than the one taken
GENERIC = (
    "Weighing the history so far, I go with {action}.",
    "Given everything observed so far, my choice is {action}.",
)
RANDOM_LINES = (
    "I pick at random this round, and it comes out {action}.",
    "No fixed plan this round: a random draw gives {action}.",
    "I mix my play to stay unpredictable; this time it is {action}.",
)

PHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "ipd": {
        "open": (
            "It is the first round, so I open by cooperating and will answer whatever the opponent does.",
            "No history yet; I start with cooperation to invite mutual cooperation.",
            "First move: I cooperate in good faith and respond to the opponent from here on.",
        ),
        "reciprocate": (
            "The opponent cooperated last round, so I reciprocate and keep cooperating.",
            "They cooperated in round {r}, so I return the favour and cooperate.",
            "Cooperation was met with cooperation last round; I keep it going.",
        ),
        "retaliate": (
            "The opponent defected last round, so I answer with a defection.",
            "They defected in round {r}; I mirror that and defect this round.",
            "A defection should not go unanswered, so I defect after their defection in round {r}.",
        ),
        "forgive": (
            "The opponent defected last round, but I forgive it to try to restore cooperation.",
            "Despite their defection in round {r}, I cooperate to give mutual cooperation another chance.",
        ),
        "trust": (
            "The opponent has cooperated every round so far, so I keep cooperating.",
            "No defection from the opponent yet; I stay cooperative.",
        ),
        "punish": (
            "The opponent defected in round {first}, so I defect for the rest of the game.",
            "Trust was broken in round {first}; I keep defecting until the end.",
        ),
        "dominant": (
            "Defecting pays more than cooperating whatever the opponent does, so I defect.",
            "Whatever the opponent plays this round, defecting earns me more, so I defect.",
            "Defection is the dominant move in every round, so I take it again.",
        ),
        "unconditional": (
            "I cooperate unconditionally, aiming for the mutual cooperation outcome.",
            "I stay cooperative whatever happened before, hoping for mutual cooperation.",
        ),
    },
    "auction": {
        "value": (
            "My value is {value}, so I bid {action}, the highest bid that does not exceed it.",
            "With a value of {value} I bid {action} and never pay more than the item is worth to me.",
            "I bid in line with my value of {value}: {action}.",
        ),
        "raise": (
            "I lost last round, so I bid one step above my usual bid for value {value}: {action}.",
            "After losing the last round I push one step higher than my value bid and go {action}.",
        ),
        "raise_capped": ("I lost last round, but {action} is already the top bid, so I keep it with value {value}.",),
        "adaptive_open": (
            "No history yet, so I start with a moderate bid of {action} and adapt from there.",
            "First round: I open at {action} and will adjust to how the opponent bids.",
        ),
        "lost_up": (
            "The opponent won last round with {opp}, so I bid one step above it: {action}.",
            "I was outbid by {opp} last round, so I raise to {action}.",
        ),
        "lost_match": ("The opponent won last round with {opp}, the top bid, so I match it with {action}.",),
        "won_down": (
            "I won last round, so I step down to one bid below the opponent's {opp}: {action}.",
            "Having won against {opp}, I try to save money with {action}.",
        ),
        "won_floor": ("I won last round against {opp}, the lowest bid, so I bid {action} as well.",),
        "tie_match": ("We tied at {opp} last round, so I bid {opp} again.",),
    },
    "neg_v1": {
        "fair": (
            "An even split of the {pie} gives me {action} and leaves {rest} to the opponent.",
            "I ask for half the pie, {action}, so that a deal stays within reach whatever the opponent does.",
            "Demanding {action} of {pie} is a fair split that avoids a breakdown.",
        ),
        "fair_after_breakdown": (
            "Last round broke down, but I keep to the fair demand of {action}.",
            "There was no deal last round; I still ask for an even {action} of {pie}.",
        ),
        "balanced": (
            "I ask for {action}, a little above an even split, leaving {rest} for the opponent.",
            "A demand of {action} is slightly ambitious but still leaves the opponent {rest}.",
        ),
        "open_high": (
            "I open with a high demand of {action} and will concede over the rounds.",
            "First round: I start ambitious at {action} and leave room to concede.",
        ),
        "concede": (
            "I lower my demand from {prev} to {action} to move toward a deal.",
            "I concede a little, from {prev} down to {action}, to make a deal more likely.",
        ),
        "hold": ("I keep my demand at {action}, where my concessions stop.",),
        "tft_open": ("I open with the fair demand of {action} and will mirror the opponent after that.",),
        "tft_answer": (
            "The opponent asked for {opp} last round, so I claim the remaining {action}.",
            "They demanded {opp}, so I ask for what is left of the {pie}: {action}.",
        ),
    },
    "neg_v2": {
        "floor_half": (
            "I ask for half of every item, rounded down, so any fair opponent can agree.",
            "A rounded-down half of each item leaves room for a deal whatever the opponent values.",
        ),
        "proportional": (
            "I take the larger half of the {high}, which I value most, and the smaller half of the rest.",
            "My values favour the {high}: I round my half up there and down elsewhere.",
        ),
        "adaptive_concede": (
            "After {breakdowns} so far, I give up {units} from my largest demands to reach a deal.",
            "We had {breakdowns}, so I lower my usual demand by {units}.",
        ),
        "defensive": (
            "I only ask for the larger half of the {top}, my most valuable item, and leave the rest.",
            "To keep the deal safe I claim just half the {top} (rounded up), the item I value most.",
        ),
    },
    "kuhn": {
        "K_open_BET": (
            "I hold the K, the best card, so I open with a bet for value.",
            "With the K nothing can beat me at showdown, so I bet to build the pot.",
        ),
        "K_open_PASS": ("I check with the K and hope the opponent bets into my strong hand.",),
        "K_checked_BET": (
            "The opponent checked and I hold the K, the best card, so I bet for value.",
            "With the K after the opponent's check, I bet to win a bigger pot.",
        ),
        "K_checked_PASS": ("The opponent checked; I check back with the K and take the showdown.",),
        "K_facing_CALL": (
            "I hold the K, which wins every showdown, so I call the bet.",
            "The K beats any card the opponent can hold, so calling is clearly right.",
        ),
        "K_facing_FOLD": ("I fold the K this time instead of calling the bet.",),
        "Q_open_PASS": (
            "With the Q a bet only gets called by a K and folds out a J, so I check.",
            "A middle card like the Q plays best as a check rather than a bet.",
        ),
        "Q_open_BET": ("I bet the middle card Q to try to take the pot right away.",),
        "Q_checked_PASS": (
            "The opponent checked; with the Q I take the free showdown, which beats a J.",
            "With the Q I check back: it beats a J at showdown without risking more.",
        ),
        "Q_checked_BET": ("After the opponent's check I bet the Q to push out a J.",),
        "Q_facing_CALL": (
            "The Q beats a bluffing J, so I call the bet.",
            "I call with the Q to keep the opponent's bluffs with the J from paying off.",
        ),
        "Q_facing_FOLD": (
            "Facing a bet, the Q usually trails a K, so I fold and save the chip.",
            "The Q loses to a value bet with the K, so I give up this hand.",
        ),
        "J_open_PASS": (
            "The J is the weakest card and cannot win a showdown, so I check.",
            "With the J I check rather than put more chips into the pot.",
        ),
        "J_open_BET": (
            "I bluff with the J now and then so that my bets do not always mean a K.",
            "A bet with the J is a bluff that keeps the opponent guessing about my card.",
        ),
        "J_checked_PASS": ("The J rarely wins, so after the check I check behind rather than bluff.",),
        "J_checked_BET": (
            "The opponent checked, showing weakness, so I bluff with the J.",
            "After the opponent's check I bet the J as a bluff to win the pot now.",
        ),
        "J_facing_FOLD": (
            "The J cannot win a showdown, so I fold to the bet.",
            "With the J I lose every showdown, so I fold rather than call.",
        ),
        "J_facing_CALL": ("I call with the J to catch a possible bluff.",),
        # a bet after my own check (game.reasoning.name_the_check): every line opens with "I checked", which
        # no line of the other spots does ("The opponent checked" is the second player's spot)
        "K_checkbet_CALL": (
            "I checked the K and the opponent bet into it, so I call and win the showdown.",
            "I checked the K to trap, and now that the opponent bets I call.",
        ),
        "K_checkbet_FOLD": ("I checked the K, the opponent bet, and I fold this time.",),
        "Q_checkbet_CALL": (
            "I checked the Q and now face the opponent's bet; it can be a J bluff, so I call.",
            "I checked the Q and the opponent bet; the Q beats a bluffing J, so I call.",
        ),
        "Q_checkbet_FOLD": (
            "I checked the Q and the opponent bet, which usually means a K, so I fold.",
            "I checked the Q and now face a bet that is mostly a K, so I fold.",
        ),
        "J_checkbet_FOLD": (
            "I checked the J and the opponent bet; the J cannot win, so I fold.",
            "I checked the J and now face a bet I cannot beat, so I fold.",
        ),
        "J_checkbet_CALL": ("I checked the J and still call the opponent's bet to catch a bluff.",),
    },
}
