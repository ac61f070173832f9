"""Numbers quoted in prose, each compared with the value a script or a notebook computed.

A :class:`Quote` binds a snippet of the prose (exact text, whitespace aside) to the values of the
numbers in it, in order: expressions a notebook's kernel evaluates, or keys of a script's result
file. :func:`check` fails unless every number of the prose lies inside a bound snippet or a
``settings`` snippet (a parameter the text states, such as a seed, not a result), and unless every
bound number agrees with its value by the words just before it:

- "about", "≈", "~", "roughly", "nearly", "around", "near": within one unit of its last digit;
- "more than", "over", "above", "beyond": the value is larger; "at least": not smaller;
- "below", "under", "less than": the value is smaller; "at most", "within", "up to": not larger;
- otherwise the value rounds to the quoted number (half a unit of its last digit).

A "not", "never" or "no" earlier in the same clause (the sentence, cut at commas, dashes and opening
parentheses) turns a bound around: "does not reach it within 500 passes" says the value is above
500. A number is an optional sign (−, + or -) and digits (38,178 with thousands separators) with
optional decimals and exponent (1e-5, 2.5e−3); digits joined to a letter or underscore (λ_1, s_0,
2π, period-2, 3-cycle, 2.6M) are part of a name, and code (blocks and `…`) is skipped. A percentage
is compared in percent: its value must be given in percent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

NUMBER = re.compile(
    r"(?<![\w.−+-])([−+-]?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?)(?:e([−+-]?\d+))?"
    r"(?![\w.]?\w|-[^\W\d])"
)
APPROX = re.compile(r"(?:about|≈|~|roughly|nearly|around|near)\s*$")
ABOVE = re.compile(r"(?:more than|over|above|beyond|>)\s*$")
AT_LEAST = re.compile(r"(?:at least|≥)\s*$")
BELOW = re.compile(r"(?:below|under|less than|<)\s*$")
AT_MOST = re.compile(r"(?:at most|within|up to|≤)\s*$")
NEGATION = re.compile(r"\b(?:not|never|no)\b|n't\b")
SENTENCE_END = re.compile(r"[.;:!?](?:\s|$)|\n\n|^\s*[-*] ", re.M)
CODE = re.compile(r"`[^`]*`")
FLIP = {"above": "at_most", "at_least": "below", "below": "at_least", "at_most": "above"}


@dataclass(frozen=True)
class Quote:
    """A snippet of prose and, in order, what each number in it is (an expression or a key)."""

    snippet: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Found:
    """One number in the prose: its text, value, last-digit unit and where it sits."""

    text: str
    value: float
    unit: float
    start: int
    end: int


def normalise(text: str) -> str:
    """Prose only: code blocks (fenced or indented) dropped, inline code blanked, runs of whitespace
    as one space."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith(("    ", "\t")):
            lines.append(line)
    text = CODE.sub(lambda m: " " * len(m.group()), "\n".join(lines))
    return re.sub(r"\s+", " ", text)


def numbers(text: str) -> list[Found]:
    """Every number of ``text`` (already normalised) with its value and the unit of its last digit."""
    out = []
    for m in NUMBER.finditer(text):
        sign, digits, exponent = m.groups()
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        power = int(exponent.replace("−", "-")) if exponent else 0
        value = float(digits.replace(",", "")) * 10.0**power * (-1.0 if sign in ("−", "-") else 1.0)
        out.append(Found(m.group(), value, 10.0 ** (power - decimals), m.start(), m.end()))
    return out


def relation(before: str, sentence: str) -> str:
    """How a quoted number bounds its value, from the words before it and the sentence's negation."""
    for name, pattern in (("approx", APPROX), ("at_least", AT_LEAST), ("above", ABOVE),
                          ("below", BELOW), ("at_most", AT_MOST)):  # fmt: skip
        if pattern.search(before):
            return FLIP[name] if name in FLIP and NEGATION.search(sentence) else name
    return "rounds"


def agrees(found: Found, value: float, how: str) -> bool:
    """Whether ``value`` is what the quoted number says under ``how``."""
    if not math.isfinite(value):
        return False
    tests: dict[str, Callable[[], bool]] = {
        "approx": lambda: abs(value - found.value) <= found.unit * (1 + 1e-9),
        "above": lambda: value > found.value,
        "at_least": lambda: value >= found.value,
        "below": lambda: value < found.value,
        "at_most": lambda: value <= found.value,
        "rounds": lambda: abs(value - found.value) <= found.unit / 2 * (1 + 1e-9),
    }
    return tests[how]()


def spans(text: str, snippet: str) -> list[tuple[int, int]]:
    """Where the (normalised) snippet occurs in the normalised text."""
    needle = normalise(snippet)
    return [(m.start(), m.start() + len(needle)) for m in re.finditer(re.escape(needle), text)]


def clause_before(text: str, position: int) -> str:
    """The clause that holds ``position``, up to it: from the sentence's start, or from the last
    comma, dash or opening parenthesis before it (a negation does not reach across them)."""
    starts = [m.end() for m in SENTENCE_END.finditer(text, 0, position)]
    sentence = text[(starts[-1] if starts else 0) : position]
    return re.split(r"[,(—–]", sentence)[-1]


def check(
    prose: str,
    quotes: Sequence[Quote],
    resolve: Callable[[str], float],
    settings: Iterable[str] = (),
) -> list[str]:
    """Every disagreement between ``prose`` and the values, one line each (empty: all agree)."""
    text, problems, covered = normalise(prose), [], []
    for quote in quotes:
        places = spans(text, quote.snippet)
        if not places:
            problems.append(f"not in the prose: {quote.snippet!r}")
        for start, end in places:
            covered.append((start, end))
            problems += _compare(text, start, numbers(text[start:end]), quote, resolve)
    for snippet in settings:
        places = spans(text, snippet)
        covered += places
        if not places:
            problems.append(f"not in the prose: {snippet!r}")
    for found in numbers(text):
        if not any(a <= found.start and found.end <= b for a, b in covered):
            context = text[max(0, found.start - 40) : found.end + 20]
            problems.append(f"{found.text!r} has no source: …{context}…")
    return problems


def _compare(
    text: str, offset: int, found: list[Found], quote: Quote, resolve: Callable[[str], float]
) -> list[str]:
    """The disagreements of one snippet occurrence's numbers with their values."""
    if len(found) != len(quote.values):
        return [f"{quote.snippet!r} holds {len(found)} numbers, bound to {len(quote.values)}"]
    problems = []
    for number, source in zip(found, quote.values, strict=True):
        at = offset + number.start
        previous = [f.end for f in found if f.end <= number.start]
        gap_start = offset + previous[-1] if previous else max(0, at - 24)
        how = relation(text[gap_start:at], clause_before(text, at))
        value = float(resolve(source))
        if not agrees(number, value, how):
            problems.append(f"{quote.snippet!r}: {number.text} ({how}) but {source} = {value:.6g}")
    return problems
