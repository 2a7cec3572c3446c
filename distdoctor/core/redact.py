"""Keeping secrets out of reports: redaction by a value's name and by its shape, in linear time.

Two kinds of evidence mark a secret:

- the name it goes by: an environment variable, a dict key, a ``key=value`` pair, a command-line
  flag (``--password X``, ``--token=X``) or an ``Authorization: Bearer X`` header whose name
  looks like a credential (``HF_TOKEN``, ``password``, ``api-key``);
- its shape, whatever it is called: a known token prefix (``hf_``, ``ghp_``, ``github_pat_``,
  ``sk-``, ``xox?-``, ``AKIA``, ``glpat-``), the password of ``user:password@host`` (with or
  without a scheme), or a long high-entropy string (32+ characters mixing upper case, lower
  case and digits).

Every function here is linear in the length of its input: text is cut into whitespace-separated
words with one linear split, and each word is examined with ``str`` methods and patterns that
cannot backtrack over more than a bounded window. No pattern is ever run where it could rescan
a long run of characters from every starting position (what made the old URL pattern quadratic:
a 100 kB value took 16 s and held the interpreter lock, so no deadline could fire).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from typing import Any, Mapping

REDACTED = "<redacted>"

# Name parts (split on _ - .) that mark a credential. Whole parts, so NCCL_IB_PKEY (a
# partition key) or MONKEY stay visible while HF_TOKEN, AWS_SECRET_ACCESS_KEY do not.
_SECRET_PARTS = {
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "PWD_SECRET", "KEY",
    "APIKEY", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "AUTHORIZATION", "PRIVATE", "COOKIE",
    "SESSION", "SIGNATURE", "CERT", "PASSPHRASE", "DSN",
}
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "API_KEY", "ACCESS_KEY")
# Known token prefixes. The look-behind keeps "task-..." from matching "sk-"; each alternative
# starts with a literal, so a failed attempt costs a few characters and the scan stays linear.
_TOKEN_SHAPE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|xox[abprs]-|AKIA|ASIA)"
    r"[A-Za-z0-9_\-]{12,}"
)
# Word separators: one linear split keeps the whitespace so the text can be put back together.
_WORDS = re.compile(r"(\s+)")
# Pieces of a word that may hold key=value pairs (URL queries, k=v;k=v lists, JSON-ish text).
_PAIR_SEPARATORS = re.compile(r"([&?;,])")
# Pieces of a word judged by entropy: runs between punctuation that tokens do not contain.
# '-' and '_' separate too, so GPU UUIDs and long identifiers are judged piece by piece.
_ENTROPY_SEPARATORS = re.compile(r"([^A-Za-z0-9+]+)")
# Tried at each position for at most 32 characters: a cheap test that a long piece exists.
_LONG_PIECE = re.compile(r"[A-Za-z0-9+]{32}")
_UPPER, _LOWER, _DIGITS = re.compile(r"[A-Z]"), re.compile(r"[a-z]"), re.compile(r"[0-9]")
_HIGH_ENTROPY_MIN_LEN = 32
_HIGH_ENTROPY_BITS = 4.0
_NAME_PARTS = re.compile(r"[_\-.]+")
# Names inside text (key=value, --flag value, a dict key in a finding's data) are judged more
# strictly than environment variable names: "key=", "signature", "session" are common there.
_STRONG_PARTS = {"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY",
                 "CREDENTIAL", "CREDENTIALS", "AUTHORIZATION", "COOKIE"}
_STRONG_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "API_KEY", "API-KEY", "ACCESS_KEY",
                    "PRIVATE_KEY", "PRIVATE-KEY")
# Words after which the next word is a credential ("Authorization: Bearer abc").
_AUTH_SCHEMES = {"bearer", "basic"}


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper == "PWD":  # the working directory, not a password
        return False
    parts = set(_NAME_PARTS.split(upper))
    return bool(parts & _SECRET_PARTS) or upper.endswith(_SECRET_SUFFIXES)


@lru_cache(maxsize=4096)
def is_secret_label(name: str) -> bool:
    """A name met inside text or data that marks its value as a credential (stricter than
    :func:`is_secret_name`): password, token, secret, api-key, credentials, authorization."""
    upper = name.upper()
    return bool(set(_NAME_PARTS.split(upper)) & _STRONG_PARTS) or upper.endswith(_STRONG_SUFFIXES)


def _flag_name(word: str) -> str | None:
    """'--password' -> 'password'; None when the word is not a long option (or -p style)."""
    if not word.startswith("-") or len(word) > 64:
        return None
    name = word.lstrip("-")
    if not name or not (name[0].isalpha()) or not name.replace("-", "").replace("_", "").isalnum():
        return None
    return name


def _key_of(text: str) -> str:
    """The identifier at the end of ``text`` ('"HF_TOKEN' -> 'HF_TOKEN', 'x?token' -> 'token')."""
    end = len(text)
    start = end
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_-."):
        start -= 1
    return text[start:end]


def _is_high_entropy(piece: str) -> bool:
    """32+ characters with upper case, lower case and 3+ digits, at 4+ bits per character:
    the shape of a generated key, not of a word, a path component or a hex digest."""
    if len(piece) < _HIGH_ENTROPY_MIN_LEN:
        return False
    if not (_UPPER.search(piece) and _LOWER.search(piece)) or len(_DIGITS.findall(piece)) < 3:
        return False
    n = len(piece)
    bits = -sum(c / n * math.log2(c / n) for c in Counter(piece).values())
    return bits >= _HIGH_ENTROPY_BITS


def _redact_userinfo(word: str, found: list[str]) -> str:
    """'https://u:pw@host/x', 'u:pw@host', 'ADDR=u:pw@host' -> the password replaced."""
    at = word.find("@")
    if at <= 0:
        return word
    scheme = word.find("://", 0, at)
    start = scheme + 3 if scheme >= 0 else word.rfind("=", 0, at) + 1
    if word.find("/", start, at) >= 0:  # an '@' in a path, not in the authority
        return word
    path = word.find("/", at)
    at = word.rfind("@", start, path if path >= 0 else len(word))  # a password may hold '@'
    colon = word.find(":", start, at)
    if colon < 0 or colon + 1 >= at or word[colon + 1 : at] == REDACTED:
        return word
    found.append(word[colon + 1 : at])
    return word[: colon + 1] + REDACTED + word[at:]


def _redact_pairs(word: str, found: list[str]) -> str:
    """key=value pieces whose key names a credential ('?token=x', 'HF_TOKEN=x', '--token=x')."""
    if "=" not in word:
        return word
    pieces = _PAIR_SEPARATORS.split(word)
    for i, piece in enumerate(pieces):
        key, eq, value = piece.partition("=")
        if eq and value and value != REDACTED and is_secret_label(_key_of(key) or "x"):
            found.append(value)
            pieces[i] = f"{key}={REDACTED}"
    return "".join(pieces)


def _redact_entropy(word: str, found: list[str]) -> str:
    if len(word) < _HIGH_ENTROPY_MIN_LEN or not _LONG_PIECE.search(word):
        return word
    pieces = _ENTROPY_SEPARATORS.split(word)
    changed = False
    for i, piece in enumerate(pieces):
        if len(piece) >= _HIGH_ENTROPY_MIN_LEN and _is_high_entropy(piece):
            found.append(piece)
            pieces[i], changed = REDACTED, True
    return "".join(pieces) if changed else word


def _redact_tokens(word: str, found: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        found.append(match.group(0))
        return REDACTED

    return _TOKEN_SHAPE.sub(replace, word)


def _redact_word(word: str, found: list[str]) -> str:
    if len(word) < 6:
        return word
    word = _redact_tokens(word, found)
    word = _redact_pairs(word, found)
    if "@" in word:
        word = _redact_userinfo(word, found)
    return _redact_entropy(word, found)


def _after_credential_name(previous: str) -> bool:
    """Is the word after ``previous`` a credential ('--password X', 'Bearer X')?"""
    flag = _flag_name(previous)
    if flag and is_secret_label(flag):
        return True
    return previous.lower() in _AUTH_SCHEMES


def redact_text(text: str, found: list[str] | None = None) -> str:
    """``text`` with every secret-shaped value replaced by ``<redacted>``; linear time.

    Words after a credential-named flag (``--password X``) or an auth scheme (``Bearer X``)
    are redacted whole. ``found``, when given, collects the removed values.
    """
    if not isinstance(text, str) or len(text) < 6:
        return text
    found = [] if found is None else found
    parts = _WORDS.split(text)
    previous = ""
    for i in range(0, len(parts), 2):  # even indices are words, odd ones the whitespace
        word = parts[i]
        if not word:
            continue
        if _after_credential_name(previous) and not word.startswith("-") and word != REDACTED:
            found.append(word)
            parts[i] = REDACTED
        else:
            parts[i] = _redact_word(word, found)
        previous = word
    return "".join(parts)


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name):
        return REDACTED
    return redact_text(value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: redact_value(name, value) for name, value in env.items()}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values that must never appear in a report, longest first (so substrings go last).

    The values of credential-named variables, and whatever shape-based redaction removes from
    any other value (the password of ``user:pw@host``, a token under a harmless name), so that
    the same secret quoted elsewhere in a report (a command line, a hostname) is caught too.
    """
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= 4}
    for value in env.values():
        found: list[str] = []
        redact_text(value, found)
        values.update(secret for secret in found if len(secret) >= 4)
    return sorted(values, key=len, reverse=True)


def _jsonable_scalar(obj: Any) -> Any:
    """A value JSON can carry: strings, numbers, booleans and None as they are, anything else as
    its (bounded) repr, so a plugin's odd ``data`` never breaks ``--format json``."""
    if obj is None or isinstance(obj, (bool, int, float)):
        if isinstance(obj, int) and not isinstance(obj, bool) and abs(obj) >= 1 << 63:
            return str(obj)
        return obj
    try:
        text = repr(obj)
    except Exception as exc:  # a __repr__ that raises
        text = f"<unprintable {type(obj).__name__}: {type(exc).__name__}>"
    return text[:2000]


def scrub(obj: Any, secrets: list[str] | tuple[str, ...] = (), *, _depth: int = 0) -> Any:
    """A JSON-safe copy of ``obj`` with every secret out of its strings.

    Removes the given secret values, then redacts by shape (:func:`redact_text`); values under
    credential-named keys and the word after a credential-named flag in a list (an argv) are
    redacted whole. Anything JSON cannot carry becomes its repr; nesting is cut at 32 levels.
    """
    if _depth > 32:
        return "<nested too deep>"
    if isinstance(obj, str):
        for secret in secrets:
            if secret in obj:
                obj = obj.replace(secret, REDACTED)
        return redact_text(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            key = key if isinstance(key, str) else str(_jsonable_scalar(key))
            if isinstance(value, str) and is_secret_label(key) and value:
                out[key] = REDACTED
            else:
                out[key] = scrub(value, secrets, _depth=_depth + 1)
        return out
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
        cleaned = [scrub(v, secrets, _depth=_depth + 1) for v in items]
        for i in range(1, len(items)):
            flag = _flag_name(items[i - 1]) if isinstance(items[i - 1], str) else None
            if flag and is_secret_label(flag) and isinstance(items[i], str) and not items[i].startswith("-"):
                cleaned[i] = REDACTED
        return cleaned if not isinstance(obj, tuple) else tuple(cleaned)
    return _jsonable_scalar(obj)
