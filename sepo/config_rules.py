"""The kinds of value a config key may take, each with the words its one-line error shows, and the way a
schema field carries its kind (`allowed`, `unchecked`): `sepo.run.rules.rules()` reads them off the schemas.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, get_type_hints

from omegaconf import MISSING


@dataclass(frozen=True)
class Rule:
    """A field's allowed values: a test, and the words the error shows."""

    ok: Callable[[Any], bool]
    allowed: str
    as_typed: bool = False  # name the value as typed (`sepo.credit=round`) instead of its repr


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def integer(low: int, high: int | None = None, optional: bool = False, why: str = "") -> Rule:
    """An integer in [low, high); `optional`: or null."""
    text = f"an integer >= {low}" + (f" and < {high}" if high is not None else "") + (", or null" if optional else "")
    return Rule(
        lambda v: (v is None and optional) or (_is_int(v) and v >= low and (high is None or v < high)),
        text + (f" ({why})" if why else ""),
    )


#: a seed numpy takes
SEED = integer(0, 2**32)


def real(low: float, strict: bool = False, high: float | None = None, high_closed: bool = False) -> Rule:
    """A finite number above `low` (or at it, unless `strict`), below `high` (or at it, if `high_closed`)."""
    if high is None:
        text = f"a number {'>' if strict else '>='} {low:g}"
    else:
        text = f"a number in {'(' if strict else '['}{low:g}, {high:g}{']' if high_closed else ')'}"
    return Rule(
        lambda v: (
            _is_real(v)
            and (v > low if strict else v >= low)
            and (high is None or (v <= high if high_closed else v < high))
        ),
        text,
    )


#: the narrowest sampling temperature: logits divided by less overflow to inf (NaN probabilities);
#: anything this sharp already samples the argmax, which temperature 0 says directly
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0


def temperature(greedy: bool) -> Rule:
    """A sampling temperature that sampling can use; `greedy`: 0 (the argmax) allowed too."""
    in_range = real(MIN_TEMPERATURE, high=MAX_TEMPERATURE, high_closed=True)
    return Rule(
        lambda v: (greedy and _is_real(v) and v == 0) or in_range.ok(v),
        ("0 (greedy) or " if greedy else "") + in_range.allowed,
    )


def one_of(*values: Any) -> Rule:
    return Rule(lambda v: v in values, ", ".join("null" if v is None else str(v) for v in values), as_typed=True)


def non_empty_name() -> Rule:
    return Rule(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty name")


def optional_name(what: str) -> Rule:
    return Rule(lambda v: v is None or (isinstance(v, str) and v.strip() != ""), f"null ({what}) or a name")


def strings() -> Rule:
    return Rule(
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings, e.g. [ablation]"
    )


def step_list() -> Rule:
    return Rule(
        lambda v: isinstance(v, (list, tuple)) and all(_is_int(x) and x >= 1 for x in v),
        "a list of integers >= 1 (e.g. [25,50,75]) or []",
    )


def steps_or_share() -> Rule:
    return Rule(
        lambda v: (_is_int(v) and v >= 1) or (isinstance(v, float) and 0.0 < v < 1.0),
        "an integer >= 1 (optimizer steps) or a number in (0, 1) (a share of the run's steps)",
    )


def boolean() -> Rule:
    """true or false: YAML's words for them only (a string such as "yes" from a typo is refused)."""
    return Rule(lambda v: isinstance(v, bool), "true or false")


def names_of(allowed: Sequence[str], what: str) -> Rule:
    """A non-empty list whose every entry is one of `allowed`."""
    return Rule(
        lambda v: isinstance(v, list) and len(v) > 0 and all(x in allowed for x in v),
        f"a non-empty list of {what} from {', '.join(allowed)}",
    )


def distinct_names_of(allowed: Sequence[str], what: str) -> Rule:
    """A list, possibly empty, of distinct entries of `allowed`."""
    return Rule(
        lambda v: isinstance(v, list) and len(set(v)) == len(v) and all(x in allowed for x in v),
        f"a list of distinct {what} from {', '.join(allowed)}, or []",
    )


def named_lists(allowed: Sequence[str], what: str) -> Rule:
    """A mapping from names to non-empty lists of `allowed` entries (datagen.dataset_games)."""
    entries = names_of(allowed, what)
    return Rule(
        lambda v: (
            isinstance(v, dict) and len(v) > 0 and all(isinstance(k, str) and entries.ok(x) for k, x in v.items())
        ),
        f"a mapping from names to {entries.allowed}",
    )


def named_integers(low: int) -> Rule:
    """A mapping from names to integers >= `low` (datagen.per_game_cap), possibly empty."""
    return Rule(
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_int(x) and x >= low for k, x in v.items()),
        f"a mapping from dataset names to integers >= {low}, or {{}}",
    )


def optional_integers_of(keys: Sequence[str], low: int, what: str) -> Rule:
    """A mapping from some of `keys` to integers >= `low` or null (sepo.rollouts_by_pool)."""
    return Rule(
        lambda v: (
            isinstance(v, dict) and all(k in keys and (x is None or (_is_int(x) and x >= low)) for k, x in v.items())
        ),
        f"a mapping from {what} ({', '.join(keys)}) to integers >= {low} or null",
    )


def finite() -> Rule:
    """Any finite number (a payoff may be negative; NaN and infinity would poison every mean)."""
    return Rule(_is_real, "a finite number")


def probability() -> Rule:
    return real(0.0, high=1.0, high_closed=True)


def regex(optional: bool = False) -> Rule:
    """A Python regular expression that compiles (a LoRA target pattern)."""

    def compiles(v: Any) -> bool:
        if v is None:
            return optional
        if not isinstance(v, str) or not v:
            return False
        try:
            re.compile(v)
        except re.error:
            return False
        return True

    return Rule(compiles, ("null or " if optional else "") + "a regular expression (Python re) over module names")


def mapping() -> Rule:
    return Rule(lambda v: isinstance(v, dict), "a mapping, e.g. {enable_thinking: false}")


def distinct_names() -> Rule:
    """A non-empty list of distinct non-empty names."""
    return Rule(
        lambda v: (
            isinstance(v, list)
            and len(v) > 0
            and all(isinstance(x, str) and x.strip() for x in v)
            and len(set(v)) == len(v)
        ),
        "a non-empty list of distinct names",
    )


def numbers(low: float) -> Rule:
    """A non-empty list of finite numbers >= low."""
    return Rule(
        lambda v: isinstance(v, list) and len(v) > 0 and all(_is_real(x) and x >= low for x in v),
        f"a non-empty list of numbers >= {low:g}",
    )


def integers(low: int) -> Rule:
    """A non-empty list of integers >= low."""
    return Rule(
        lambda v: isinstance(v, list) and len(v) > 0 and all(_is_int(x) and x >= low for x in v),
        f"a non-empty list of integers >= {low}",
    )


def distinct_amounts(low: int) -> Rule:
    """A non-empty mapping from names to distinct integers >= low (an auction's bids and what each costs)."""
    return Rule(
        lambda v: (
            isinstance(v, dict)
            and len(v) > 0
            and all(isinstance(k, str) and k.strip() and _is_int(x) and x >= low for k, x in v.items())
            and len(set(v.values())) == len(v)
        ),
        f"a non-empty mapping from bid names to distinct integers >= {low}",
    )


def even_integer(low: int) -> Rule:
    return Rule(lambda v: _is_int(v) and v >= low and v % 2 == 0, f"an even integer >= {low}")


# ------------------------------------------------------------------------------ rules on schema fields
#: where a field's rule applies: "all", the stages named (space-separated), or a condition on the config;
#: None takes its node's (sepo.run.rules.nodes())
Where = str | Callable[[Any], bool] | None
_RULE, _WHERE, _REASON = "rule", "where", "unchecked"


def allowed(rule: Rule | Callable[[], Rule], *, where: Where = None) -> Any:
    """A schema field that must hold a value, with its allowed values: the rule, or a function giving it where
    they are known only when the config is checked (the penalty terms and games registered then)."""
    return field(default=MISSING, metadata={_RULE: rule, _WHERE: where})


def unchecked(reason: str, default_factory: Callable[[], Any] | None = None) -> Any:
    """A schema field with no rule of its own, and why (another check covers it, or any value will do)."""
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={_REASON: reason})
    return field(default=MISSING, metadata={_REASON: reason})


@dataclass(frozen=True)
class FieldRule:
    """A leaf of a schema with what the config check needs of it: its rule (None with a `reason`)."""

    key: str
    rule: Rule | None
    where: Where
    reason: str = ""


def schema_rules(schema: type, prefix: str) -> list[FieldRule]:
    """Every leaf of `schema` (nested schemas walked), keyed `prefix.name...`. A boolean field needs no rule
    written: true or false is all it can be."""
    rows = []
    types = get_type_hints(schema)
    for f in fields(schema):
        key, kind = f"{prefix}.{f.name}" if prefix else f.name, types[f.name]
        if is_dataclass(kind) and f.default_factory is not NO_DEFAULT:
            rows += schema_rules(kind, key)
            continue
        rule = f.metadata.get(_RULE)
        if rule is not None and not isinstance(rule, Rule):
            rule = rule()
        if rule is None and kind is bool:
            rule = boolean()
        rows.append(FieldRule(key, rule, f.metadata.get(_WHERE), f.metadata.get(_REASON, "")))
    return rows
