"""batch_ingest.bus_auth's files: seeds, the producers' registry and the rendered users."""

from __future__ import annotations

import json
import stat

import pytest

from batch_ingest.bus_auth import BusAuth, main, public_key


def test_init_makes_the_service_seeds_once_and_renders_them(tmp_path):
    auth = BusAuth(tmp_path)
    auth.ensure_service_users()
    consumer = auth.seed_file("consumer").read_bytes()
    assert (
        consumer.startswith(b"SU")
        and stat.S_IMODE(auth.seed_file("consumer").stat().st_mode) == 0o600
    )
    auth.ensure_service_users()
    assert auth.seed_file("consumer").read_bytes() == consumer  # kept
    text = auth.conf.read_text()
    assert public_key(consumer) in text and "permissions" not in text  # the consumer: full


def test_a_producer_is_bound_to_its_teams_and_revoked(tmp_path):
    auth = BusAuth(tmp_path)
    auth.ensure_service_users()
    seed = auth.issue("billing", ["dao_a", "team b", "dao_a"], subject_prefix="p.")
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    entry = auth.producers()["billing"]
    assert entry["teams"] == ["dao_a", "team b"] and entry["public_key"] == public_key(
        seed.read_bytes()
    )
    conf = json.loads(auth.conf.read_text().split("authorization", 1)[1])
    (producer,) = [u for u in conf["users"] if "permissions" in u]
    allow = producer["permissions"]["publish"]["allow"]
    assert "p.rag.team.dao_a.doc.upserted.billing" in allow
    assert "p.rag.team.=dGVhbSBi.doc.deleted.billing" in allow
    assert not any(s.endswith((".doc.upserted", ".doc.deleted")) for s in allow)
    assert not any("*" in s or ">" in s for s in allow)
    assert auth.revoke("billing") and not seed.exists()
    assert "permissions" not in auth.conf.read_text() and not auth.revoke("billing")


@pytest.mark.parametrize("name", ["", "Billing", "a b", "consumer", "operator", "x" * 65])
def test_a_bad_producer_name_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match="producer name"):
        BusAuth(tmp_path).issue(name, ["dao_a"])


def test_the_cli_issues_lists_and_revokes(tmp_path, capsys):
    assert main(["--dir", str(tmp_path), "init"]) == 0
    assert main(["--dir", str(tmp_path), "issue", "crm", "--teams", "dao_a"]) == 0
    assert "producers/crm.nk" in capsys.readouterr().out
    assert main(["--dir", str(tmp_path), "list"]) == 0
    assert capsys.readouterr().out.startswith("crm\tdao_a\t")
    assert main(["--dir", str(tmp_path), "issue", "crm", "--teams", " "]) == 2
    assert main(["--dir", str(tmp_path), "revoke", "crm"]) == 0
    assert main(["--dir", str(tmp_path), "revoke", "crm"]) == 2
