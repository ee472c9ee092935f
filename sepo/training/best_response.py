"""Keeps a SEPO run's best-response exploiters current: exploitability descent through SEPO.

An exploit opponent that responds to the agent (`BestResponse`, Kuhn poker) is the exact best
response to the agent's played table. As the policy moves, that response goes stale, so every
`sepo.best_response_every` optimizer steps the table is estimated again from the current policy
(`sepo.best_response_samples` sampled answers per information set, the estimator of
`sepo.policies.played`), or taken from an evaluation that has just read that very policy alike
(`adopt`), and the responders switch to the new response. Between refreshes the
responder is fixed, so its episodes carry the gradient of the policy's value against it; by
Danskin's theorem that is the gradient of the exploitability (Lockhart et al. 2019, "Computing
approximate equilibria in sequential adversarial games by exploitability descent").

The table, and the step whose policy it was read from, live in the checkpoint
(`best_response.json`), so a resumed run keeps the very response of the uninterrupted one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sepo.profiling import section

FILE = "best_response.json"


@dataclass
class BestResponseSchedule:
    """When to re-read the agent's table, and the responders that play against it."""

    responders: list[Any]  # strategies with `respond_to(table)`
    every: int  # optimizer steps between two reads of the table
    samples: int  # sampled answers per information set
    seed: int  # keys the sampling streams together with the step
    step: int | None = None  # the step whose policy the current response answers
    table: dict[str, list[float]] | None = field(default=None, repr=False)

    def due(self, step: int) -> bool:
        return bool(self.responders) and (self.step is None or step - self.step >= self.every)

    def refresh(self, game: Any, policy: Any, step: int) -> dict[str, float]:
        """Read the current policy's table and respond to it; returns what it cost and what it read."""
        started = time.time()
        with section("best_response_read"):
            played = game.played_table(
                policy,
                samples=self.samples,
                seed=int(np.random.SeedSequence([self.seed, step, 0xB5]).generate_state(1)[0]),
            )
        return self.adopt(played, step, time.time() - started)

    def adopt(self, played: Any, step: int, seconds: float = 0.0) -> dict[str, float]:
        """Respond to `played`, the table of the policy as it is at `step`: read by `refresh`, or by the
        evaluation of a checkpoint at that step (the same estimator on other sampling streams, when its
        settings are the run's: `sepo.stages.sepo_loop.answer_checkpoint_read`); returns what it read."""
        self._respond({k: v.tolist() for k, v in played.table.items()}, step)
        return {
            "best_response/seconds": seconds,
            "best_response/decisions_sampled": float(played.samples * len(played.table)),
            "best_response/exploit_exact": played.exploitability,
            "best_response/exploit_exact_se": played.exploitability_se,
            "best_response/rao_blackwellised": played.rao_blackwellised,
            # which information sets move, and which way: the run's dashboard shows the table over the steps
            **{f"best_response/bet_or_call/{key}": float(p[1]) for key, p in played.table.items()},
        }

    def _respond(self, table: dict[str, list[float]], step: int) -> None:
        self.table, self.step = table, step
        for responder in self.responders:
            responder.respond_to({k: np.asarray(v, dtype=float) for k, v in table.items()})

    def save(self, checkpoint: Path) -> None:
        if self.table is not None:
            (checkpoint / FILE).write_text(json.dumps({"step": self.step, "table": self.table}) + "\n")

    def load(self, checkpoint: Path) -> None:
        path = checkpoint / FILE
        if self.responders and path.exists():
            saved = json.loads(path.read_text())
            self._respond(saved["table"], int(saved["step"]))
