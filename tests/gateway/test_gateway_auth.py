"""Tokens: loading from a file and a variable, constant-time lookup, ACL containment."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

from pantheon.gateway import TokenError, load_tokens
from pantheon.gateway import _auth as auth_module

DOC = """
tokens:
  - {name: a, token: "aaaaaaaaaaaaaaaa1", publish: ["data.*"], subscribe: ["data.*", "x.y", "z.>"]}
  - {name: b, token: "bbbbbbbbbbbbbbbb2", publish: [], subscribe: [">"]}
"""


def test_every_entry_is_compared_with_compare_digest_even_after_a_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(DOC)
    monkeypatch.setenv("MORE_TOKENS", '{"tokens": [{"name": "c", "token": "cccccccccccccccc3"}]}')
    tokens = load_tokens(path, "MORE_TOKENS")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", counting)
    grant = tokens.check("aaaaaaaaaaaaaaaa1")
    assert grant is not None and grant.name == "a"
    assert len(calls) == 3  # the first entry matched; the other two were compared anyway
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests, not the raw tokens
    assert tokens.check("cccccccccccccccc3").name == "c"  # type: ignore[union-attr]
    assert tokens.check("aaaaaaaaaaaaaaaa") is None


def test_subscribe_patterns_must_lie_within_a_grant(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(DOC)
    a = load_tokens(path).check("aaaaaaaaaaaaaaaa1")
    assert a is not None
    assert a.may_subscribe("data.*") and a.may_subscribe("data.orders") and a.may_subscribe("x.y")
    assert a.may_subscribe("z.>") and a.may_subscribe("z.*.q") and a.may_subscribe("z.a")
    assert not a.may_subscribe(">") and not a.may_subscribe("data.>")
    assert not a.may_subscribe("x.*") and not a.may_subscribe("z") and not a.may_subscribe("*.y")
    assert a.may_publish("data.q") and not a.may_publish("data.q.r") and not a.may_publish("x.y")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tokens: 3", "t.yaml: expected a mapping with a 'tokens' list"),
        ("tokens: [{name: a, token: short}]", "t.yaml: tokens[0].token: a string of at least 16"),
        (
            'tokens: [{name: a, token: "aaaaaaaaaaaaaaaa1", publish: ["a.b*"]}]',
            "t.yaml: tokens[0].publish[0]: ",
        ),
        ('tokens: [{name: a, token: "aaaaaaaaaaaaaaaa1", pub: []}]', "unknown field 'pub'"),
        (
            'tokens: [{name: a, token: "aaaaaaaaaaaaaaaa1"},'
            ' {name: a, token: "bbbbbbbbbbbbbbbb2"}]',
            "two tokens are named 'a'",
        ),
    ],
)
def test_a_bad_tokens_document_names_where(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TokenError) as caught:
        load_tokens(path)
    assert message in str(caught.value)
    assert "short" not in str(caught.value)  # a token's value is never echoed


def test_a_missing_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKENS", raising=False)
    with pytest.raises(TokenError, match=r"\$NO_SUCH_TOKENS: the tokens variable is not set"):
        load_tokens(None, "NO_SUCH_TOKENS")
