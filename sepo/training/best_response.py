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
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo.policies.played_table import PlayedTable, played_table
from sepo.profiling import section

log = logging.getLogger(__name__)

FILE = "best_response.json"


def refresh_read(s: DictConfig) -> dict[str, Any]:
    """How the best responders' refresh reads the played table (`played_table` in results.json records the
    same keys): answers a state, temperature and answer budget."""
    return {
        "samples_per_state": s.best_response_samples,
        "temperature": s.temperature,
        "max_new_tokens": s.max_new_tokens,
    }


def reads_alike(cfg: DictConfig, s: DictConfig) -> bool:
    """Whether an evaluation reads the played table as the best responders' refresh does (cascade attention
    aside, which moves roundings only)."""
    evaluation = {
        "samples_per_state": cfg.eval.action_samples,
        "temperature": cfg.eval.temperature,
        "max_new_tokens": cfg.eval.max_new_tokens,
    }
    return evaluation == refresh_read(s)


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
            played = played_table(
                game,
                policy,
                samples=self.samples,
                seed=int(np.random.SeedSequence([self.seed, step, 0xB5]).generate_state(1)[0]),
            )
        return self.adopt(played, step, time.time() - started)

    def adopt(self, played: Any, step: int, seconds: float = 0.0) -> dict[str, float]:
        """Respond to `played`, the table of the policy as it is at `step`: read by `refresh`, or by the
        evaluation of a checkpoint at that step (the same estimator on other sampling streams, when its
        settings are the run's: `answer_checkpoint_read`); returns what it read."""
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

    # ------------------------------------------------------------------ reads made elsewhere, answered
    def answer(self, table: Any, step: int, what: str) -> dict[str, float]:
        """Respond to `table`, a read of the policy as it is at `step` made elsewhere (`what`); returns what it read."""
        cost = self.adopt(table, step)
        log.info(
            "step %d  best response answers %s: exploit_exact %.3f ± %.3f",
            step,
            what,
            cost["best_response/exploit_exact"],
            cost["best_response/exploit_exact_se"],
        )
        return cost

    def answer_sft_read(self, cfg: DictConfig, s: DictConfig, game: Any, step: int) -> dict[str, float] | None:
        """At step 0 the policy is the SFT model (its fresh adapter adds nothing). Where the SFT run that made
        `model.path` (its `merged/`) read that model's table as the responders would (`eval/sft/results.json`:
        the SFT row's test evaluation, with the same answers a state, temperature and budget), they answer that
        read instead of reading the same model again; returns what it read, or None where it answered none."""
        if step != 0 or not cfg.model.path or not self.due(0):
            return None
        path = Path(cfg.model.path).parent / "eval" / "sft" / "results.json"
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # no SFT evaluation beside the model (or an unreadable one): the run reads the table itself
        read = payload.get("played_table") or {}
        if (
            payload.get("stage") != "sft"
            or payload.get("game") != cfg.game.name
            or any(read.get(k) != v for k, v in refresh_read(s).items())
        ):
            return None
        table = PlayedTable.from_json(read, game.ante, game.bet)
        return self.answer(table, 0, f"the SFT evaluation's test read ({path})")

    def answer_checkpoint_read(self, cfg: DictConfig, s: DictConfig, table: Any, step: int) -> dict[str, float] | None:
        """Where the responders are due to re-read the policy at a checkpoint's step, they answer the
        checkpoint's test read instead: the same policy read by the same estimator, so a second read (a minute
        of a Kuhn run on smollm2) would only draw other samples. The read's samples are the policy's own
        answers at the 12 information sets, no test episode: the episodes the tables report stay unseen.
        Returns what it read, or None where it answered none."""
        if table is None or not self.due(step) or not reads_alike(cfg, s):
            return None
        return self.answer(
            table, step, f"the checkpoint's test read ({table.samples * len(table.table)} sampled answers)"
        )
