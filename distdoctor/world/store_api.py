"""The c10d store's methods as this torch has them: one a release lacks is made from ones it has.

torch binds ``Store.check`` (do these keys exist, without waiting) in Python from 2.3 on; on
torch 2.1 and 2.2 the call raises AttributeError. Every store since 2.1 has ``compare_set``, and its
answer tells presence without writing anything: for a missing key and a non-empty expected
value it returns the expected value and sets nothing; for a present key whose value differs it
returns the value (TCPStore, FileStore, HashStore and PrefixStore alike, measured on 2.1.2).
The expected value is a random token of this process, which no writer can know, so a present
key never equals it. So ``compare_set(key, ABSENT, ABSENT)`` is also a read that never waits: the
value, or ABSENT (``get`` and ``multi_get`` wait until every key exists, up to the store's timeout).

The store's extended API (``append``, ``multi_get``, ``multi_set``: torch's "Store extended API",
pytorch/pytorch#100379, in 2.1) is bound in Python by the TCPStore of every supported release, but a
store class may lack it (a user's own Store, a wrapper): ``append`` is then made from
``compare_set`` (read, then swap in the longer value, again if another writer came between), and
``multi_get`` from one ``get`` per key.

Which one is used is decided once per store class (feature detection: the attribute is looked
up, never the version), and the answer is the same either way.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import sys
from typing import Any, Iterator, Mapping, Sequence

# A value no other process writes: compare_set(key, ABSENT, ABSENT) answers ABSENT only when
# the key does not exist (and then sets nothing).
ABSENT = "distdoctor-absent-" + secrets.token_hex(16)
_ABSENT_BYTES = ABSENT.encode()

# store class -> whether its instances answer ``check`` (decided on first use).
_HAS_CHECK: dict[type, bool] = {}


def innermost(store: Any) -> Any:
    """The store under distdoctor's own key-prefix wrappers (they delegate ``check`` to it)."""
    seen = 0
    while hasattr(store, "inner") and seen < 8:
        store, seen = store.inner, seen + 1
    return store


def has_check(store: Any) -> bool:
    """Whether ``store`` (through its wrappers) has a ``check`` method of its own."""
    kind = type(innermost(store))
    if kind not in _HAS_CHECK:
        _HAS_CHECK[kind] = callable(getattr(kind, "check", None))
    return _HAS_CHECK[kind]


def keys_exist(store: Any, keys: Sequence[str]) -> bool:
    """Whether every key exists, without waiting for any (``Store.check``, or its equivalent)."""
    keys = list(keys)
    if has_check(store):
        return bool(store.check(keys))
    return all(_present(store, key) for key in keys)


def _present(store: Any, key: str) -> bool:
    return not is_absent(store.compare_set(key, ABSENT, ABSENT))


def is_absent(answer: Any) -> bool:
    """Whether ``compare_set(key, ABSENT, ABSENT)`` answered that the key does not exist."""
    if isinstance(answer, str):
        answer = answer.encode()
    return bytes(answer) == _ABSENT_BYTES


# (store class, method) -> whether its instances have it (decided on first use).
_HAS: dict[tuple[type, str], bool] = {}


def has_method(store: Any, name: str) -> bool:
    """Whether ``store`` (through its wrappers) has method ``name`` of its own."""
    key = (type(innermost(store)), name)
    if key not in _HAS:
        _HAS[key] = callable(getattr(key[0], name, None))
    return _HAS[key]


def append(store: Any, key: str, value: str, tries: int = 64) -> None:
    """Append ``value`` to the value at ``key`` (made when missing): ``Store.append``, or its equivalent."""
    if has_method(store, "append"):
        store.append(key, value)
        return
    old = b""
    for _ in range(tries):
        new = old + value.encode()
        got = store.compare_set(key, old.decode(errors="replace"), new.decode(errors="replace"))
        got = got.encode() if isinstance(got, str) else bytes(got)
        if got == new:
            return
        old = got  # another writer came between: append to what it left
    raise RuntimeError(f"could not append to {key!r}: {tries} concurrent writers in a row")


def multi_get(store: Any, keys: Sequence[str]) -> list[bytes]:
    """The values of keys that all exist (``Store.multi_get``: one request; else one ``get`` each)."""
    keys = list(keys)
    if not keys:
        return []
    if has_method(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(key) for key in keys]


def serve_on_listener(host: str, port: int, listen_fd: int, **options: Any) -> Any:
    """A TCPStore server on a socket that already listens (``listen_fd``, which stays the caller's).

    torch's libuv store backend (the default from 2.4) could not take a listen fd in every
    release: torch 2.4 raises NotImplementedError ("does not support initialization with an
    listen fd"), and the environment variable its message suggests, USE_LIBUV=0, is read only by
    torch's rendezvous, not by this constructor. So the default backend is tried first, and on
    that refusal the legacy backend (``use_libuv=False``; the keyword exists since torch 2.1) is
    asked for by name. The store gets a duplicate of the descriptor, so a refused attempt leaves
    the caller's socket intact for the next; the caller closes its own copy afterwards. torch
    also logs the refusal in C++ on stderr, advising USE_LIBUV=0: that line is held back, since
    distdoctor took the other way and the advice would mislead.
    """
    from torch.distributed import TCPStore  # the caller has imported torch.distributed already

    def attempt(**extra: Any) -> Any:
        fd = os.dup(listen_fd)
        try:
            return TCPStore(host, port, is_master=True, master_listen_fd=fd, **options, **extra)
        except BaseException:
            os.close(fd)  # torch leaves a refused descriptor open (measured on 2.4.1)
            raise

    refused = False
    with stderr_held() as held:
        try:
            return attempt()
        except NotImplementedError:
            if "use_libuv" in options:
                raise
            refused = True
        finally:
            held.keep = lambda line: not (refused and "listen fd" in line)
    return attempt(use_libuv=False)


class _Held:
    def __init__(self) -> None:
        self.keep: Any = lambda line: True


@contextlib.contextmanager
def stderr_held() -> Iterator[_Held]:
    """What C++ writes to file descriptor 2 meanwhile is held, then written back line by line
    where ``held.keep(line)`` says so (Python's own sys.stderr is flushed first)."""
    import tempfile  # only here: this module is on every rank's path

    held = _Held()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield held  # no descriptor 2 to hold (a closed stderr): nothing to filter
        return
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            kept = [line for line in buffer.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if held.keep(line)]
            if kept:
                try:
                    os.write(2, "".join(kept).encode())
                except OSError:
                    pass


def rendezvous_store_options(scheme: str, query: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Any]:
    """The TCPStore options torch's env:// and tcp:// rendezvous ask for, so a store distdoctor
    opens first on MASTER_PORT is one torch's own (multi-tenant) store can share.

    Three rules, told apart by what torch's rendezvous module has (read in the wheels):
    torch 2.4 on have ``_get_use_libuv_from_query_dict``: ``use_libuv`` in the URL, else
    USE_LIBUV, else libuv (legacy on Windows); torch 2.2-2.3 pass ``use_libuv`` to
    ``_create_c10d_store`` from the URL (and USE_LIBUV for env://), legacy by default; torch 2.1
    passes no choice, so the constructor's default holds (legacy; its PyPI wheels have no libuv
    at all), and none is passed here either.
    """
    try:
        # The module (torch.distributed's attribute of that name is the function rendezvous()).
        rendezvous = importlib.import_module("torch.distributed.rendezvous")
    except ImportError:
        return {}
    if hasattr(rendezvous, "_get_use_libuv_from_query_dict"):
        default = "0" if sys.platform == "win32" else "1"
        return {"use_libuv": query.get("use_libuv", env.get("USE_LIBUV", default)) == "1"}
    import inspect  # only here: this module is on every rank's path, and inspect costs ~10 ms to import

    try:
        takes = "use_libuv" in inspect.signature(rendezvous._create_c10d_store).parameters
    except (AttributeError, TypeError, ValueError):
        takes = False
    if not takes:
        return {}
    fallback = env.get("USE_LIBUV", "0") if scheme == "env" else "0"
    return {"use_libuv": query.get("use_libuv", fallback) == "1"}


def store_refusal(exc: BaseException) -> str:
    """Why torch's TCPStore constructor refused an option this torch build lacks ('' when the
    error is not such a refusal: an address, a port, a connection)."""
    text = str(exc)
    lowered = text.lower()
    if isinstance(exc, NotImplementedError):
        return first_line_of(text) or "not implemented in this torch"
    if "libuv" in lowered and ("missing" in lowered or "without libuv" in lowered):
        return "this torch is built without libuv, the store backend asked for (USE_LIBUV=1 or use_libuv=1 in the URL)"
    if isinstance(exc, TypeError) and "incompatible" in lowered:
        return "this torch's TCPStore does not take one of the options given: " + first_line_of(text)
    return ""


def first_line_of(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:300] if text else ""
