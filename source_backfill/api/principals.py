"""Static bearer tokens from a file, each naming a principal and its roles per namespace.

The file (JSON, or YAML when PyYAML is installed: it is not a dependency of the daemon) holds no token,
only its SHA-256::

    principals:
      - name: team-a-ci
        token_sha256: "<hex sha256 of the token>"
        roles: {team-a: editor}

A plain hash, not a slow password hash: the tokens are random secrets of 256 bits (:func:`new_token`),
which no dictionary holds and no brute force reaches, so what a slow hash adds against guessing is
nothing, and every request would pay it. The hash keeps a leaked file (a backup, a config dump) from
being a set of working credentials.

Rotation: rewrite the file with the new hash (both hashes under two names while clients move), then
:meth:`TokenPrincipals.reload`; a file that does not load leaves the previous set in force.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from source_backfill.core.access import Principal, parse_roles
from source_backfill.errors import ConfigError

logger = logging.getLogger(__name__)

#: Where the principals come from, as :attr:`Principal.source`.
SOURCE = "token_file"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEYS = frozenset({"name", "token_sha256", "roles"})
_EMPTY_TOKEN_SHA256 = hashlib.sha256(b"").hexdigest()


def hash_token(token: str) -> str:
    """The hex SHA-256 of the token's UTF-8 bytes: what the file holds in ``token_sha256``."""
    return _digest(token).hex()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def new_token() -> tuple[str, str]:
    """A new random token (256 bits, URL-safe) and its hash: give the first out, write the second down."""
    token = secrets.token_urlsafe(32)
    return token, hash_token(token)


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal


class TokenPrincipals:
    """The principals of a token file; :meth:`authenticate` finds whose token a request carries.

    Thread-safe: requests authenticate from the server's threads while :meth:`reload` swaps the set.
    """

    def __init__(self, entries: tuple[_Entry, ...], path: Path | None = None) -> None:
        self._entries = entries
        self._path = path
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenPrincipals:
        """The principals of the file at ``path``; ConfigError saying which entry is wrong and why."""
        file = Path(path)
        return cls(_load(file), file)

    @property
    def path(self) -> Path | None:
        """The file :meth:`reload` reads again (None: built from entries, nothing to reload)."""
        return self._path

    def names(self) -> tuple[str, ...]:
        """The principals' names, in the file's order."""
        with self._lock:
            return tuple(e.principal.name for e in self._entries)

    def authenticate(self, token: str) -> Principal | None:
        """The principal whose token this is; None: no one's (an empty token is no one's).

        Every entry's hash is compared, in constant time, whichever matches: how long it takes does not
        tell how far down the file a token's entry is, or whether it has one.
        """
        digest = _digest(token)
        with self._lock:
            entries = self._entries
        found: Principal | None = None
        for entry in entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry.principal
        return found if token else None

    def reload(self) -> bool:
        """Read the same file again and serve its principals; False (the previous ones kept) if it fails.

        The warning logged says why in the loader's words, which name entries, never tokens or hashes.
        """
        if self._path is None:
            return False
        try:
            entries = _load(self._path)
        except ConfigError as exc:
            with self._lock:
                kept = len(self._entries)
            logger.warning('token file not reloaded, the previous principals stay path="%s" kept=%d '
                           'reason="%s"', self._path, kept, exc)
            return False
        with self._lock:
            self._entries = entries
        logger.info('token file reloaded path="%s" principals=%d', self._path, len(entries))
        return True


def _load(path: Path) -> tuple[_Entry, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"token file {path}: cannot be read ({exc.strerror or type(exc).__name__})"
        raise ConfigError(msg) from None
    except UnicodeDecodeError:
        msg = f"token file {path}: not UTF-8 text"
        raise ConfigError(msg) from None
    document = _parse(path, text)
    try:
        return _entries(document)
    except ValueError as exc:
        msg = f"token file {path}: {exc}"
        raise ConfigError(msg) from None


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            msg = f"token file {path}: YAML needs PyYAML (pip install pyyaml), or write the file as .json"
            raise ConfigError(msg) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            msg = f"token file {path}: not YAML{where} ({getattr(exc, 'problem', None) or 'parse error'})"
            raise ConfigError(msg) from None  # its own text quotes the line, which may hold a hash
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            msg = f"token file {path}: not JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})"
            raise ConfigError(msg) from None
    msg = f"token file {path}: name it .json, .yaml or .yml (its format is told by its extension)"
    raise ConfigError(msg)


def _entries(document: Any) -> tuple[_Entry, ...]:
    if not isinstance(document, dict) or not isinstance(document.get("principals"), list):
        msg = "needs a top-level `principals:` list"
        raise ValueError(msg)
    entries: list[_Entry] = []
    owners: dict[bytes, str] = {}
    for index, raw in enumerate(document["principals"]):
        entry = _entry(index, raw)
        name = entry.principal.name
        if any(e.principal.name == name for e in entries):
            msg = f"principal {name!r} is named twice"
            raise ValueError(msg)
        if entry.digest in owners:
            msg = f"principals {owners[entry.digest]!r} and {name!r} have the same token_sha256 (one each)"
            raise ValueError(msg)
        owners[entry.digest] = name
        entries.append(entry)
    return tuple(entries)


def _entry(index: int, raw: Any) -> _Entry:
    if not isinstance(raw, dict):
        msg = f"principals[{index}] must be a mapping with name, token_sha256 and roles"
        raise ValueError(msg)
    name = raw.get("name")
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        msg = f"principals[{index}]: name {name!r} is not a name (letters, digits, _ . @ -, 128 at most)"
        raise ValueError(msg)
    where = f"principal {name!r}"
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        msg = f"{where}: unknown keys {', '.join(unknown)} (it has name, token_sha256 and roles)"
        raise ValueError(msg)
    digest = raw.get("token_sha256")
    if not isinstance(digest, str) or _HEX_SHA256.fullmatch(digest.strip().lower()) is None:
        got = (type(digest).__name__ if not isinstance(digest, str) else "a non-hex digit"
               if len(digest.strip()) == 64 else f"{len(digest.strip())} characters")
        msg = f"{where}: token_sha256 must be 64 hex digits, the SHA-256 of the token (got {got})"
        raise ValueError(msg)
    digest = digest.strip().lower()
    if digest == _EMPTY_TOKEN_SHA256:
        msg = f"{where}: token_sha256 is the hash of the empty token"
        raise ValueError(msg)
    try:
        roles = parse_roles(raw.get("roles"))
    except ValueError as exc:
        msg = f"{where}: {exc}"
        raise ValueError(msg) from None
    if not roles:
        msg = f"{where}: roles is empty (a principal that may see nothing: remove it instead)"
        raise ValueError(msg)
    return _Entry(bytes.fromhex(digest), Principal(name, roles, SOURCE))
