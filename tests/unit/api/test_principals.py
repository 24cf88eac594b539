"""Static tokens from a file: loading, authenticating, rotating, and refusing bad files."""

import hashlib
import json
import logging
import re
import sys
import threading

import pytest

from source_backfill.api import principals as principals_module
from source_backfill.api.principals import TokenPrincipals, hash_token, new_token
from source_backfill.core.access import Role
from source_backfill.errors import ConfigError

CI_TOKEN = "ci-token-" + "a" * 40
DASH_TOKEN = "dash-token-" + "b" * 40


def _write(path, entries):
    if path.suffix == ".json":
        path.write_text(json.dumps({"principals": entries}))
    else:
        lines = ["principals:"]
        for e in entries:
            lines += [f"  - name: {e['name']}", f"    token_sha256: \"{e['token_sha256']}\"",
                      f"    roles: {json.dumps(e['roles'])}"]
        path.write_text("\n".join(lines) + "\n")
    return path


def _entries(ci=CI_TOKEN, dash=DASH_TOKEN):
    return [{"name": "team-a-ci", "token_sha256": hash_token(ci), "roles": {"team-a": "editor"}},
            {"name": "dashboard", "token_sha256": hash_token(dash), "roles": {"*": "viewer"}}]


@pytest.fixture(params=["principals.yaml", "principals.json"])
def token_file(request, tmp_path):
    return _write(tmp_path / request.param, _entries())


def test_hash_token_is_the_hex_sha256_of_the_utf8_token():
    assert hash_token("é") == hashlib.sha256("é".encode()).hexdigest()


def test_new_token_is_random_and_comes_with_its_hash():
    (token, digest), (other, _) = new_token(), new_token()
    assert token != other and len(token) >= 43
    assert digest == hash_token(token)


def test_each_token_names_its_principal(token_file):
    tokens = TokenPrincipals.from_file(token_file)
    assert tokens.names() == ("team-a-ci", "dashboard")
    ci = tokens.authenticate(CI_TOKEN)
    assert ci is not None and ci.name == "team-a-ci" and ci.source == "token_file"
    assert ci.role_in("team-a") is Role.EDITOR and not ci.sees("team-b")
    dash = tokens.authenticate(DASH_TOKEN)
    assert dash is not None and dash.may(Role.VIEWER, "team-b") and not dash.may(Role.OPERATOR, "team-b")


@pytest.mark.parametrize("token", ["", "wrong", CI_TOKEN + " ", CI_TOKEN.upper(), hash_token(CI_TOKEN)])
def test_a_wrong_or_empty_token_is_no_one(token_file, token):
    assert TokenPrincipals.from_file(token_file).authenticate(token) is None


def test_every_entry_is_compared_whichever_matches(token_file, monkeypatch):
    tokens = TokenPrincipals.from_file(token_file)
    calls = []
    real = principals_module.hmac.compare_digest
    monkeypatch.setattr(principals_module.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    for token in (CI_TOKEN, DASH_TOKEN, "wrong"):
        calls.clear()
        tokens.authenticate(token)
        assert len(calls) == 2


def test_rotation_rewrites_the_file_and_reloads(token_file):
    tokens = TokenPrincipals.from_file(token_file)
    rotated = "ci-token-rotated-" + "c" * 40
    _write(token_file, _entries(ci=rotated))
    assert tokens.authenticate(CI_TOKEN) is not None  # nothing changes before the reload
    assert tokens.reload() is True
    assert tokens.authenticate(CI_TOKEN) is None
    principal = tokens.authenticate(rotated)
    assert principal is not None and principal.name == "team-a-ci"


def test_a_broken_file_on_reload_keeps_the_previous_set(token_file, caplog):
    tokens = TokenPrincipals.from_file(token_file)
    secret_hash = hash_token("new-" + "d" * 40)
    token_file.write_text(token_file.read_text().replace("team-a-ci", "dashboard").replace(
        hash_token(CI_TOKEN), secret_hash))
    with caplog.at_level(logging.WARNING, logger="source_backfill.api.principals"):
        assert tokens.reload() is False
    assert tokens.authenticate(CI_TOKEN) is not None
    assert "named twice" in caplog.text and "kept=2" in caplog.text
    assert secret_hash not in caplog.text and hash_token(DASH_TOKEN) not in caplog.text
    token_file.unlink()
    assert tokens.reload() is False
    assert tokens.authenticate(DASH_TOKEN) is not None


def test_a_yaml_error_does_not_quote_the_line(tmp_path):
    digest = hash_token(CI_TOKEN)
    path = tmp_path / "p.yaml"
    path.write_text(f'principals:\n  - name: x\n    token_sha256: "{digest}\n    roles: [\n')
    with pytest.raises(ConfigError, match="not YAML") as raised:
        TokenPrincipals.from_file(path)
    assert digest[:16] not in str(raised.value)


def _refusal(tmp_path, entries):
    with pytest.raises(ConfigError) as raised:
        TokenPrincipals.from_file(_write(tmp_path / "p.json", entries))
    for entry in entries:
        digest = entry.get("token_sha256")
        if isinstance(digest, str) and len(digest) > 8:
            assert digest not in str(raised.value)
    return str(raised.value)


def test_duplicates_are_refused_naming_the_entries(tmp_path):
    twice = _entries() + [{**_entries()[0], "token_sha256": hash_token("x" * 40)}]
    assert "principal 'team-a-ci' is named twice" in _refusal(tmp_path, twice)
    same = _entries(dash=CI_TOKEN)
    message = _refusal(tmp_path, same)
    assert "'team-a-ci' and 'dashboard' have the same token_sha256" in message


@pytest.mark.parametrize(("change", "message"), [
    ({"token_sha256": "ab" * 31}, "'dashboard': token_sha256 must be 64 hex digits.* 62 characters"),
    ({"token_sha256": "zz" * 32}, "principal 'dashboard': token_sha256 must be 64 hex digits.* non-hex"),
    ({"token_sha256": 12}, "got int"),
    ({"token_sha256": hashlib.sha256(b"").hexdigest()}, "hash of the empty token"),
    ({"roles": {"team-b": "root"}}, "'dashboard': namespace 'team-b': unknown role 'root' .*one of"),
    ({"roles": {"team b": "viewer"}}, "principal 'dashboard': bad namespace 'team b'"),
    ({"roles": {}}, "roles is empty"),
    ({"roles": None}, "roles must be a mapping"),
    ({"role": {"*": "viewer"}}, "unknown keys role"),
    ({"name": ""}, r"principals\[1\]: name '' is not a name"),
])
def test_a_bad_entry_is_refused_naming_it(tmp_path, change, message):
    entries = _entries()
    entries[1] = {**entries[1], **change}
    assert re.search(message, _refusal(tmp_path, entries))


def test_a_file_without_principals_or_with_another_extension_is_refused(tmp_path):
    (tmp_path / "p.json").write_text("[]")
    with pytest.raises(ConfigError, match="top-level `principals:` list"):
        TokenPrincipals.from_file(tmp_path / "p.json")
    (tmp_path / "p.toml").write_text("")
    with pytest.raises(ConfigError, match=r"\.json, \.yaml or \.yml"):
        TokenPrincipals.from_file(tmp_path / "p.toml")
    with pytest.raises(ConfigError, match="cannot be read"):
        TokenPrincipals.from_file(tmp_path / "absent.json")


def test_yaml_without_pyyaml_says_so(tmp_path, monkeypatch):
    path = _write(tmp_path / "p.yaml", _entries())
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(ConfigError, match="YAML needs PyYAML"):
        TokenPrincipals.from_file(path)


def test_authenticate_while_reloading_from_threads(tmp_path):
    path = _write(tmp_path / "p.json", _entries())
    tokens = TokenPrincipals.from_file(path)
    failures = []

    def ask():
        for _ in range(300):
            if tokens.authenticate(DASH_TOKEN) is None:
                failures.append(1)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(30):
        assert tokens.reload()
    for t in threads:
        t.join()
    assert not failures
