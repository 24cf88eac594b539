"""Who may do what, where: roles held per namespace (pure: no I/O, no clock).

A :class:`Principal` is whoever a credential names (a static token's entry, an OIDC token's subject) with
the :class:`Role` it holds in each namespace. Roles are ordered, each granting what the ones below it
grant, so a check is one comparison: :meth:`Principal.may`. A role held on :data:`ALL_NAMESPACES` holds
in every namespace, the explicit ones and those not created yet; where a principal holds roles both on
``*`` and on a namespace, the higher one counts.

ADMIN held on ``*`` (:attr:`Principal.is_admin`) is the daemon's whole control, beyond any one namespace.
ADMIN held on one namespace grants everything there and nothing daemon-wide.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from source_backfill.config import NAME_PATTERN

#: The key of a role held in every namespace.
ALL_NAMESPACES = "*"

#: A namespace is named like a job (it prefixes paths, metric labels and URLs the same way).
NAMESPACE_PATTERN = NAME_PATTERN
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


class Role(enum.IntEnum):
    """What a principal may do in a namespace; a higher role grants everything a lower one does."""

    #: Read jobs, metrics and verify runs.
    VIEWER = 1
    #: Steer running jobs: pause, resume, throttle, retry, repair.
    OPERATOR = 2
    #: Change what runs: create jobs, patch transforms, drop jobs.
    EDITOR = 3
    #: Everything; on ``*``, in every namespace and daemon-wide.
    ADMIN = 4

    @classmethod
    def parse(cls, text: str) -> Role:
        """The role named ``text``, in any case; ValueError naming the roles there are."""
        try:
            return cls[text.strip().upper()]
        except (KeyError, AttributeError):
            allowed = ", ".join(r.name.lower() for r in cls)
            msg = f"unknown role {text!r} (one of {allowed})"
            raise ValueError(msg) from None


def is_namespace(name: str) -> bool:
    """Whether ``name`` is a namespace's name (``*`` is not: it is the key for all of them)."""
    return _NAMESPACE.fullmatch(name) is not None


def parse_roles(raw: object) -> dict[str, Role]:
    """``{namespace: role name}`` as written in a file or a token claim -> ``{namespace: Role}``.

    ValueError names the first namespace or role that is wrong; the loaders add which entry it was in.
    """
    if not isinstance(raw, Mapping):
        msg = f"roles must be a mapping of namespace to role, not {type(raw).__name__}"
        raise ValueError(msg)
    roles: dict[str, Role] = {}
    for namespace, role in raw.items():
        if not isinstance(namespace, str) or not (namespace == ALL_NAMESPACES or is_namespace(namespace)):
            msg = f"bad namespace {namespace!r} (a name like a job's, or \"*\" for all)"
            raise ValueError(msg)
        if not isinstance(role, str):
            msg = f"namespace {namespace!r}: role must be a string, not {type(role).__name__}"
            raise ValueError(msg)
        try:
            roles[namespace] = Role.parse(role)
        except ValueError as exc:
            msg = f"namespace {namespace!r}: {exc}"
            raise ValueError(msg) from None
    return roles


@dataclass(frozen=True)
class Principal:
    """Whoever a credential names, with the role it holds in each namespace (``*``: in all of them).

    The roles are copied into a read-only mapping at construction, so a principal handed to a request
    cannot be widened by whoever built it; a bad namespace or a role that is not a :class:`Role` is a
    ValueError.
    """

    name: str
    roles: Mapping[str, Role] = field(default_factory=dict)
    #: Which credential named it: ``token`` (``api.token``), ``token_file``, ``oidc``.
    source: str = "token"

    def __post_init__(self) -> None:
        if not self.name:
            msg = "a principal needs a name"
            raise ValueError(msg)
        for namespace, role in self.roles.items():
            if namespace != ALL_NAMESPACES and not is_namespace(namespace):
                msg = f"principal {self.name!r}: bad namespace {namespace!r}"
                raise ValueError(msg)
            if not isinstance(role, Role):
                msg = f"principal {self.name!r}: {role!r} in {namespace!r} is not a Role"
                raise ValueError(msg)
        object.__setattr__(self, "roles", MappingProxyType(dict(self.roles)))

    def __hash__(self) -> int:
        return hash((self.name, frozenset(self.roles.items()), self.source))

    def role_in(self, namespace: str) -> Role | None:
        """The role it holds in ``namespace``: the higher of that namespace's and ``*``'s; None: none."""
        held = [r for r in (self.roles.get(namespace), self.roles.get(ALL_NAMESPACES)) if r is not None]
        return max(held) if held else None

    def may(self, role: Role, namespace: str) -> bool:
        """Whether it holds ``role`` (or a higher one) in ``namespace``."""
        held = self.role_in(namespace)
        return held is not None and held >= role

    def sees(self, namespace: str) -> bool:
        """Whether it holds any role in ``namespace`` (what it may not see, it is not told exists)."""
        return self.role_in(namespace) is not None

    def namespaces(self) -> frozenset[str]:
        """The namespaces it holds a role in by name (not ``*``: that one names none of them)."""
        return frozenset(n for n in self.roles if n != ALL_NAMESPACES)

    @property
    def is_admin(self) -> bool:
        """Whether it holds ADMIN on ``*``: every namespace, and what belongs to none (the daemon's own)."""
        return self.roles.get(ALL_NAMESPACES) is Role.ADMIN


#: The one principal of the legacy single ``api.token`` (and ``api.token_file``): it may do everything.
ADMIN_PRINCIPAL = Principal("admin", {ALL_NAMESPACES: Role.ADMIN}, "token")
