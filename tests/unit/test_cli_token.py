"""``source-backfill token``: the token it prints authenticates by the entry it prints (which holds none)."""

import json

from source_backfill.api.principals import TokenPrincipals
from source_backfill.cli import EXIT_OK, EXIT_USAGE, main
from source_backfill.core.access import Role


def test_the_printed_token_authenticates_by_the_printed_entry(tmp_path, capsys):
    assert main(["token", "team-a-ci", "--role", "team-a=editor", "--role", "*=viewer"]) == EXIT_OK
    token_line, entry_line = capsys.readouterr().out.splitlines()
    token = token_line.rsplit(" ", 1)[1]
    entry = json.loads(entry_line.split(": ", 1)[1])
    assert token not in entry_line
    path = tmp_path / "principals.json"
    path.write_text(json.dumps({"principals": [entry]}))
    principal = TokenPrincipals.from_file(path).authenticate(token)
    assert principal is not None and principal.name == "team-a-ci"
    assert principal.may(Role.EDITOR, "team-a") and not principal.may(Role.OPERATOR, "team-b")


def test_a_role_that_does_not_parse_is_a_usage_error(capsys):
    assert main(["token", "x", "--role", "team-a=boss"]) == EXIT_USAGE
    assert main(["token", "x", "--role", "team-a"]) == EXIT_USAGE
    assert "unknown role 'boss'" in capsys.readouterr().err
