"""Roles per namespace: parsing, the checks, and their properties."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.access import (
    ADMIN_PRINCIPAL,
    ALL_NAMESPACES,
    NAMESPACE_PATTERN,
    Principal,
    Role,
    is_namespace,
    parse_roles,
)

namespaces = st.from_regex(re.compile(NAMESPACE_PATTERN), fullmatch=True)
roles = st.sampled_from(list(Role))
role_maps = st.dictionaries(st.one_of(namespaces, st.just(ALL_NAMESPACES)), roles, max_size=4)


@pytest.mark.parametrize("text", ["viewer", "VIEWER", "Viewer", " viewer "])
def test_role_names_in_any_case(text):
    assert Role.parse(text) is Role.VIEWER


@pytest.mark.parametrize("text", ["root", "", "1", "view"])
def test_an_unknown_role_names_the_allowed_ones(text):
    with pytest.raises(ValueError, match="one of viewer, operator, editor, admin"):
        Role.parse(text)


def test_roles_are_ordered_each_granting_the_lower():
    assert Role.VIEWER < Role.OPERATOR < Role.EDITOR < Role.ADMIN


def test_the_higher_of_the_namespace_and_star_counts():
    p = Principal("ci", {"team-a": Role.EDITOR, ALL_NAMESPACES: Role.VIEWER}, "token_file")
    assert p.role_in("team-a") is Role.EDITOR
    assert p.role_in("team-b") is Role.VIEWER
    assert p.may(Role.OPERATOR, "team-a") and not p.may(Role.OPERATOR, "team-b")
    assert p.namespaces() == frozenset({"team-a"})
    assert not p.is_admin
    q = Principal("ops", {"team-a": Role.VIEWER, ALL_NAMESPACES: Role.OPERATOR})
    assert q.role_in("team-a") is Role.OPERATOR


def test_no_roles_sees_nothing():
    p = Principal("nobody", {}, "oidc")
    assert p.role_in("team-a") is None
    assert not p.sees("team-a") and not p.may(Role.VIEWER, "team-a")
    assert p.namespaces() == frozenset()


def test_the_legacy_token_is_admin_everywhere():
    assert ADMIN_PRINCIPAL.is_admin
    assert ADMIN_PRINCIPAL.may(Role.ADMIN, "anything")
    assert ADMIN_PRINCIPAL.namespaces() == frozenset()


def test_admin_on_one_namespace_is_not_the_daemons_admin():
    p = Principal("lead", {"team-a": Role.ADMIN})
    assert p.may(Role.ADMIN, "team-a") and not p.is_admin


def test_roles_cannot_be_widened_after_construction():
    given_roles = {"team-a": Role.VIEWER}
    p = Principal("ci", given_roles)
    given_roles["team-b"] = Role.ADMIN
    assert not p.sees("team-b")
    with pytest.raises(TypeError):
        p.roles["team-b"] = Role.ADMIN  # type: ignore[index]
    assert hash(p) == hash(Principal("ci", {"team-a": Role.VIEWER}))
    assert p == Principal("ci", {"team-a": Role.VIEWER})


@pytest.mark.parametrize("roles", [{"bad/ns": Role.VIEWER}, {"": Role.VIEWER}, {"a": 2}])
def test_a_bad_namespace_or_role_is_refused(roles):
    with pytest.raises(ValueError, match="principal 'x'"):
        Principal("x", roles)


def test_parse_roles_names_what_is_wrong():
    assert parse_roles({"team-a": "Editor", "*": "viewer"}) == {"team-a": Role.EDITOR, "*": Role.VIEWER}
    with pytest.raises(ValueError, match="bad namespace '../x'"):
        parse_roles({"../x": "viewer"})
    with pytest.raises(ValueError, match="namespace 'team-a': unknown role 'god'"):
        parse_roles({"team-a": "god"})
    with pytest.raises(ValueError, match="namespace 'team-a': role must be a string"):
        parse_roles({"team-a": 3})
    with pytest.raises(ValueError, match="must be a mapping"):
        parse_roles(["team-a"])


def test_star_is_not_a_namespace_name():
    assert not is_namespace(ALL_NAMESPACES)
    assert is_namespace("team-a.prod_1")


@given(role_maps, namespaces, roles, roles)
def test_may_is_monotone_in_the_role(held, namespace, low, high):
    low, high = sorted((low, high))
    p = Principal("p", held)
    if p.may(high, namespace):
        assert p.may(low, namespace)


@given(roles, namespaces, role_maps)
def test_a_role_on_star_holds_everywhere(role, namespace, others):
    p = Principal("p", {**others, ALL_NAMESPACES: role})
    assert p.sees(namespace)
    assert p.may(role, namespace)
    assert p.is_admin == (role is Role.ADMIN)


@given(namespaces, namespaces, roles)
def test_roles_only_in_a_never_see_b(a, b, role):
    p = Principal("p", {a: role})
    assert p.sees(a)
    assert p.sees(b) == (a == b)
    assert p.may(role, b) == (a == b)
