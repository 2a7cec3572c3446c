"""Make a quoted log line safe to show: control sequences stripped, secrets redacted, in linear time."""

# Logs are input from anywhere. A line quoted as evidence may carry terminal escape sequences (an
# OSC title, a screen clear, an OSC 8 link) and secrets (a Bearer token, HF_TOKEN=..., a URL's
# user:password@). Everything `explain` renders from a log goes through `clean_quote` first.
# Every pattern here is linear: no nested or adjacent unbounded quantifiers that could backtrack,
# and lines are bounded by the caller before they get here.

from __future__ import annotations

import re

REDACTED = "<redacted>"

# ESC [ ... final byte (CSI), ESC ] ... BEL or ESC \ (OSC), other two-byte ESC sequences.
_ESCAPES = re.compile(r"\x1b\[[0-?]{0,64}[ -/]{0,8}[@-~]?|\x1b\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|\x9b[0-?]{0,64}[ -/]{0,8}[@-~]?")
# C0 controls except tab, DEL, C1 controls: removed after the sequences are gone.
_CONTROLS = dict.fromkeys([*range(0, 9), *range(10, 32), 0x7F, *range(0x80, 0xA0)])

_SECRET_NAMES = r"[A-Za-z0-9_]{0,40}(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|AUTH)[A-Za-z0-9_]{0,20}"
_PATTERNS = [
    # Authorization: Bearer <token>, Basic <base64>
    (re.compile(r"\b(Bearer|Basic|Token)(\s{1,5})[A-Za-z0-9._~+/=-]{8,}", re.I), r"\1\2" + REDACTED),
    # NAME=value / NAME: value / --name value for secret-looking names
    (re.compile(r"\b(" + _SECRET_NAMES + r")(\s{0,3}[=:]\s{0,3}[\"']?)[^\s\"',;&]{1,}", re.I), r"\1\2" + REDACTED),
    (re.compile(r"(--?(?:token|password|passwd|secret|api[-_]key)[= ]{1,3})[^\s\"']{1,}", re.I), r"\1" + REDACTED),
    # query-string forms: ?token=..., &password=...
    (re.compile(r"([?&;](?:token|access_token|password|passwd|secret|sig|signature|key)=)[^\s&\"']{1,}", re.I), r"\1" + REDACTED),
    # known token shapes: Hugging Face, GitHub, OpenAI-style, Slack, AWS access key ids, JWTs
    (re.compile(r"\b(?:hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}"
                r"|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"),
     REDACTED),
]


def strip_controls(text: str) -> str:
    """Remove terminal escape sequences and control characters (tab is kept)."""
    if "\x1b" in text or "\x9b" in text:
        text = _ESCAPES.sub("", text)
    return text.translate(_CONTROLS)


def _redact_userinfo(text: str) -> str:
    """user:password@host -> user:<redacted>@host, with or without a scheme; linear in the text."""
    if "@" not in text:
        return text
    out: list[str] = []
    pos = 0
    for word_match in re.finditer(r"\S{1,4096}", text):
        word = word_match.group()
        at = word.rfind("@")
        if at <= 0:
            continue
        start = max(word.rfind("/", 0, at), word.rfind("=", 0, at), word.rfind("'", 0, at), word.rfind('"', 0, at)) + 1
        colon = word.find(":", start, at)
        if colon == -1 or colon + 1 >= at:
            continue
        base = word_match.start()
        out.append(text[pos:base + colon + 1])
        out.append(REDACTED)
        pos = base + at
    out.append(text[pos:])
    return "".join(out)


def redact_secrets(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return _redact_userinfo(text)


def clean_quote(text: str) -> str:
    """What a log line may look like when explain shows it."""
    return redact_secrets(strip_controls(text))
