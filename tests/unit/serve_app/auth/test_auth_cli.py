"""python -m serve_app.auth: a minted dev token and a new API key work with the gateway."""

from __future__ import annotations

import pytest

from serve_app.auth.__main__ import main
from serve_app.auth.api_keys import ApiKeyStore
from serve_app.auth.tokens import TokenVerifier
from serve_app.settings import AuthSettings
from serve_app.testing import AUDIENCE, ISSUER, PEPPER, SECRET

pytestmark = pytest.mark.usefixtures("clean_gateway_env")


def test_minted_token_verifies_and_carries_teams(monkeypatch, capsys):
    monkeypatch.setenv("AUTH__HS256_SECRET", SECRET)
    monkeypatch.setenv("AUTH__ISSUER", ISSUER)
    monkeypatch.setenv("AUTH__AUDIENCE", AUDIENCE)
    main(["mint-token", "--sub", "alice", "--team", "dao_a=owner,member", "--group", "ops"])
    token = capsys.readouterr().out.strip()
    verifier = TokenVerifier(AuthSettings(hs256_secret=SECRET, issuer=ISSUER, audience=AUDIENCE))
    claims = verifier.verify(token)
    assert claims["teams"] == {"dao_a": ["owner", "member"]}
    assert claims["groups"] == ["ops"]


def test_mint_token_without_a_secret_stops(capsys):
    with pytest.raises(SystemExit, match="AUTH__HS256_SECRET"):
        main(["mint-token", "--sub", "alice", "--team", "dao_a=owner"])


def test_new_api_key_entry_verifies_the_printed_key(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("AUTH__API_KEY_PEPPER", PEPPER)
    main(["new-api-key", "--team", "dao_a=service", "--agent-id", "ag_ingest"])
    out = capsys.readouterr().out
    key = next(line[2:] for line in out.splitlines() if line.startswith("# rgk_"))
    path = tmp_path / "keys.yaml"
    path.write_text(out)
    principal = ApiKeyStore(str(path), PEPPER).verify(key)
    assert principal.agent_id == "ag_ingest"
    assert dict(principal.teams) == {"dao_a": ("service",)}


@pytest.mark.parametrize("ttl", ["-60", "0", "2592001", "1h"])
def test_mint_token_refuses_a_lifetime_that_is_not_1_s_to_30_days(monkeypatch, capsys, ttl):
    monkeypatch.setenv("AUTH__HS256_SECRET", SECRET)
    with pytest.raises(SystemExit) as stop:
        main(["mint-token", "--sub", "alice", "--team", "dao_a=owner", "--ttl", ttl])
    assert stop.value.code == 2
    assert "--ttl" in capsys.readouterr().err


def test_every_option_has_help(capsys):
    wanted = {
        "mint-token": (
            "roles in it",
            "a group of",
            "a permission",
            "agent id",
            "subject",
            "lifetime in seconds",
            "AUTH__ISSUER",
            "AUTH__AUDIENCE",
        ),
        "new-api-key": ("roles in it", "a group of", "a permission", "agent id", "a name for"),
    }
    for command, phrases in wanted.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for phrase in phrases:
            assert phrase in text, (command, phrase)
