"""The init_method a job hands to init_process_group, and the rendezvous endpoint it implies.

torch has no environment variable for init_method (it is an argument), so the user tells
distdoctor through its configuration (--init-method, DISTDOCTOR_INIT_METHOD or init-method in
[tool.distdoctor]); without one the job uses env:// and the endpoint is MASTER_ADDR:MASTER_PORT.
Forms (torch/distributed/rendezvous.py): env://, tcp://host:port, file:///abs/path; mpi:// is
not a rendezvous handler: with backend="mpi" torch ignores init_method, with any other backend
init_process_group fails with "No rendezvous handler for mpi://".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from distdoctor.core.config import Config

SCHEMES = ("env", "tcp", "file", "mpi")


@dataclass(frozen=True)
class InitMethod:
    raw: str
    scheme: str
    host: str | None = None
    port: int | None = None
    path: str | None = None
    problem: str | None = None


def parse(raw: str) -> InitMethod:
    text = raw.strip()
    if "://" not in text:
        return InitMethod(raw, "", problem=f"{raw!r} has no scheme (expected env://, tcp://HOST:PORT or file:///PATH)")
    try:
        url = urlparse(text)
    except ValueError as exc:
        return InitMethod(raw, "", problem=f"{raw!r} is not a URL ({exc})")
    scheme = url.scheme.lower()
    if scheme not in SCHEMES:
        return InitMethod(raw, scheme, problem=f"torch has no rendezvous handler for {scheme}:// (it knows env://, tcp://, file://)")
    if scheme == "tcp":
        try:
            port = url.port
        except ValueError:
            return InitMethod(raw, scheme, url.hostname, problem=f"the port in {raw!r} is not a number in 1-65535")
        if not url.hostname:
            return InitMethod(raw, scheme, problem=f"{raw!r} names no host (expected tcp://HOST:PORT)")
        if port is None or not 1 <= port <= 65535:
            return InitMethod(raw, scheme, url.hostname, problem=f"{raw!r} names no usable port (expected tcp://HOST:PORT with PORT in 1-65535)")
        return InitMethod(raw, scheme, url.hostname, port)
    if scheme == "file":
        path = unquote(url.path or "")
        if url.netloc:
            # file://relative/path puts "relative" in netloc: torch then uses only the path part.
            return InitMethod(raw, scheme, path=path, problem=f"{raw!r} is not an absolute file URL (use file:///absolute/path, three slashes)")
        if not path.startswith("/"):
            return InitMethod(raw, scheme, path=path, problem=f"{raw!r} names no absolute path")
        return InitMethod(raw, scheme, path=path)
    return InitMethod(raw, scheme)


def from_config(config: "Config") -> InitMethod | None:
    raw = config.init_method
    return parse(raw) if raw else None


def setting_label(config: "Config") -> str:
    """How to name the init_method in a finding: its value and where it came from."""
    return f"init_method={config.init_method} ({config.sources.get('init_method', 'configuration')})"


def rendezvous_endpoint(config: "Config", master_addr: str | None, master_port: int | None) -> tuple[str | None, int | None, str]:
    """(host, port, where they come from) of the store every rank will connect to."""
    method = from_config(config)
    if method is not None and method.scheme == "tcp" and not method.problem:
        return method.host, method.port, setting_label(config)
    return master_addr, master_port, "MASTER_ADDR:MASTER_PORT"
