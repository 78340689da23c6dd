"""The rule classifier's one-scan matcher gives exactly the verdicts of searching every pattern
separately: on the whole support dataset, on generated texts, and for generated and awkward
patterns (which the matcher may only fall back on, never misjudge)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.intents import INTENTS

from agents import RuleProvider
from agents._providers import _ASCII_FOLD, _needles, _PatternSet

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = yaml.safe_load((ROOT / "scenarios" / "support_email.yaml").read_text())
RULES: dict[str, list[str]] = SCENARIO["provider"]["rules"]
PROVIDER = RuleProvider(RULES, SCENARIO["provider"]["default_intent"], intents=INTENTS)


def old_classify(
    rules: dict[str, list[re.Pattern[str]]], default: str, subject: str, body: str
) -> dict[str, Any]:
    """The classifier as it was before the matcher (verbatim), the definition to keep."""
    scores: dict[str, float] = {}
    for intent, patterns in rules.items():
        score = 0.0
        for pattern in patterns:
            if pattern.search(subject):
                score += 2.0
            if pattern.search(body):
                score += 1.0
        if score:
            scores[intent] = score
    if not scores:
        return {"intent": default, "confidence": 0.3, "scores": {}}
    total = sum(scores.values())
    intent = max(scores, key=lambda k: (scores[k], -INTENTS.index(k)))
    return {
        "intent": intent,
        "confidence": round(scores[intent] / total, 4),
        "scores": {k: round(v / total, 4) for k, v in sorted(scores.items())},
    }


def assert_same(provider: RuleProvider, subject: str, body: str) -> None:
    want = old_classify(provider._rules, provider.default_intent, subject, body)
    assert provider._classify(subject, body) == want
    assert provider._classify_reference(subject, body) == want


def dataset_emails() -> list[tuple[str, str]]:
    emails = []
    for line in (ROOT / "scenarios" / "data" / "support_emails.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the dataset's malformed lines never reach the Reasoner
        if isinstance(record, dict):
            emails.append((str(record.get("subject", "")), str(record.get("body", ""))))
    return emails


def test_every_dataset_email_gets_the_old_verdict() -> None:
    emails = dataset_emails()
    assert len(emails) >= 590
    intents = set()
    for subject, body in emails:
        assert_same(PROVIDER, subject, body)
        intents.add(PROVIDER._classify(subject, body)["intent"])
    assert intents == set(INTENTS)  # the comparison covered every kind of verdict


def test_the_scenario_patterns_all_get_a_prefilter() -> None:
    """Else the speed-up silently goes: a pattern without needles is searched every time."""
    for patterns in PROVIDER._rules.values():
        for pattern in patterns:
            assert _needles(pattern), pattern.pattern


# Words that the scenario's patterns look for, and characters that fold onto ASCII letters
# when case is ignored, so generated texts hit patterns often and in awkward ways.
VOCAB = sorted({w for ps in RULES.values() for p in ps for w in re.findall(r"[a-z']+", p)})
TRICKY = ["\u017f", "\u212a", "\u0130", "\u0131", "\u00df", "\u00e9", " ", "\n", "% ", "://"]


def _disguise(word: str, how: int) -> str:
    return [
        word,
        word.upper(),
        word.title(),
        word.replace("s", "\u017f").replace("k", "\u212a"),
        word.replace("i", "\u0131").upper().replace("I", "\u0130"),
    ][how]


pieces = st.one_of(
    st.builds(_disguise, st.sampled_from(VOCAB), st.integers(0, 4)),
    st.sampled_from(TRICKY),
    st.text(max_size=4),
    st.from_regex(r"[0-9]{1,3}", fullmatch=True),
)
texts = st.lists(pieces, max_size=25).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, texts)
def test_generated_texts_get_the_old_verdict(subject: str, body: str) -> None:
    assert_same(PROVIDER, subject, body)


def _regexes() -> st.SearchStrategy[str]:
    """Small regexes of the kinds scenarios write: words, alternations, optional parts,
    classes, repeats, boundaries, lookarounds, scoped flags."""
    atom = st.one_of(
        st.sampled_from(VOCAB).map(re.escape),
        st.sampled_from(["a", "s", "k", "i", " ", "%", "'", "\u00e9", "\u017f"]).map(re.escape),
        st.sampled_from([r"\d", r"\w", r"\s", ".", "[sd]", "[a-f]", "[^a]", r"\b", "^", "$"]),
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(inner, min_size=1, max_size=4).map("".join),
            st.lists(inner, min_size=2, max_size=4).map(lambda xs: "(" + "|".join(xs) + ")"),
            inner.map(lambda x: f"(?:{x})?"),
            st.tuples(inner, st.sampled_from(["+", "*", "{2}", "{1,3}", "+?"])).map(
                lambda t: f"(?:{t[0]}){t[1]}"
            ),
            inner.map(lambda x: f"(?={x})"),
            inner.map(lambda x: f"(?-i:{x})"),
        )

    body = st.recursive(atom, extend, max_leaves=8)
    return st.tuples(st.sampled_from(["", "(?i)", "(?a)", "(?ai)"]), body).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_regexes(), min_size=1, max_size=4), st.lists(texts, min_size=1, max_size=4))
def test_generated_patterns_match_as_searched_one_by_one(
    patterns: list[str], samples: list[str]
) -> None:
    compiled = [re.compile(p) for p in patterns]
    matcher = _PatternSet(compiled)
    for text in samples:
        assert matcher(text) == [p.search(text) is not None for p in compiled]


AWKWARD = {
    # nothing ASCII and literal that every match holds: searched every time
    r"\d{3}": None,
    r"(\w+)\1": None,
    "\u00e9\u00e8": None,  # non-ASCII literals may match ASCII text when case is ignored
    "(?i)\u212a": None,
    r"x?y?": None,  # matches the empty string
    r"[^a]b|\d": None,  # one alternative has no literal
    # a prefilter, and the right one
    r"\d{3}-\d{4}": ("-",),
    r"(\w+) \1": (" ",),
    "caf\u00e9": ("caf",),
    "(?i)\u212aelvin": ("elvin",),
    r"[^a]bc|d": ("bc", "d"),
    r"(?i)(?<!not )\brefund": ("refund",),
    r"(?x) re fund   # verbose": ("refund",),
    r"(?i:RE)FUND": ("refund",),
    r"ab{2,}c": ("a",),
    r"(?>abc|abd)e": ("abce", "abde"),
}


@pytest.mark.parametrize("pattern", sorted(AWKWARD))
def test_awkward_patterns_fall_back_or_filter_correctly(pattern: str) -> None:
    compiled = re.compile(pattern)
    assert _needles(compiled) == AWKWARD[pattern]
    provider = RuleProvider({"refund": [compiled], "spam": [r"(?i)\bspam\b"]})
    for text in [
        "", "refund", "REFUND", "not refund", "Re\u017ffund", "abbbc", "abce", "555-1234",
        "word word", "caf\u00e9", "CAF\u00c9", "\u212aelvin", "kelvin", "xbc", "d", "spam",
        "\u00e9t\u00e9", "\u00c9T\u00c9", "\u212a", "k", "ab", "123 123",
    ]:  # fmt: skip
        assert_same(provider, text, text[::-1])


def test_compiled_patterns_keep_their_flags() -> None:
    provider = RuleProvider({"bug": [re.compile("crash", re.IGNORECASE)]})
    assert_same(provider, "CRASH", "")
    assert provider._classify("CRASH", "")["intent"] == "bug"


def test_the_case_fold_table_lists_every_non_ascii_character_re_folds_to_ascii() -> None:
    ascii_any_case = re.compile(r"(?i)[\x00-\x7f]")
    folds = {}
    for code in range(0x80, sys.maxunicode + 1):
        ch = chr(code)
        if ascii_any_case.fullmatch(ch):
            matched = {
                a.lower() for a in map(chr, range(0x80)) if re.fullmatch(re.escape(a), ch, re.I)
            }
            (folds[ch],) = matched
    assert folds == {chr(k): v for k, v in _ASCII_FOLD.items()}
