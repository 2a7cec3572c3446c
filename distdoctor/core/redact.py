"""Keeping secrets out of reports: env values whose names look like credentials are redacted."""

from __future__ import annotations

import re
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
# user:password@ in URLs found in any value.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper == "PWD":  # the working directory, not a password
        return False
    parts = set(re.split(r"[_\-.]+", upper))
    return bool(parts & _SECRET_PARTS) or upper.endswith(_SECRET_SUFFIXES)


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name):
        return REDACTED
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: redact_value(name, value) for name, value in env.items()}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values that must never appear in a report, longest first (so substrings go last)."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= 4}
    for value in env.values():
        for match in _URL_USERINFO.finditer(value):
            if len(match["pw"]) >= 4:
                values.add(match["pw"])
    return sorted(values, key=len, reverse=True)


def scrub(obj: Any, secrets: list[str]) -> Any:
    """Replace every secret value inside strings of a JSON-like structure."""
    if not secrets:
        return obj
    if isinstance(obj, str):
        for secret in secrets:
            if secret in obj:
                obj = obj.replace(secret, REDACTED)
        return obj
    if isinstance(obj, Mapping):
        return {k: scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(scrub(v, secrets) for v in obj)
    return obj
