"""Bus credentials: NATS nkey users, each producer bound to its teams by the server's own
subject permissions (issue 34; NATS "Authorization" with nkeys, nothing home-made).

    python -m batch_ingest.bus_auth init            # the consumer's and operators' seeds
    python -m batch_ingest.bus_auth issue billing --teams dao_a,dao_b   # prints the seed path
    python -m batch_ingest.bus_auth revoke billing
    python -m batch_ingest.bus_auth list

Files, under ``var/nats/auth`` of the repository (``RAG_VAR_DIR``; ``--dir``):

- ``consumer.nk``, ``operator.nk``: the seeds of the bus consumer and of operators (no
  restriction: the consumer reads every team and writes the dead-letter stream and the
  notices; operators manage streams and read the dead letters);
- ``producers.json``: ``name → {public_key, teams, subject_prefix, issued_at}``;
- ``producers/<name>.nk``: a producer's seed (mode 0600), handed to that producer;
- ``auth.conf``: the ``authorization`` block that ``var/nats/nats.conf`` includes, rendered
  from the above. With users listed, the server refuses anonymous connections.

A producer may publish ``rag.team.<team>.<type>.<name>`` for its teams and the event types
only, the last token its own name (so the bus vouches for the producer the audit log records),
subscribe to its teams' notices ``rag.team.<team>.document.>`` and to its own reply inbox
``_INBOX.<name>.>`` (it connects with ``inbox_prefix="_INBOX.<name>"``, which JetStream's
publish acknowledgements need): no other team's subject, no dead letters, no other client's
replies (a consumer's fetched events travel on its inbox). Issuing or revoking a producer
rewrites ``auth.conf`` and reloads a running ``nats-server`` (SIGHUP), which applies it to
connections already open.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_ingest.event_types import PRODUCER_NAME, SUBJECT_TYPES, TEAM_SUBJECTS, team_token

ROOT = Path(__file__).resolve().parents[1]
SERVICE_USERS = ("consumer", "operator")


def default_dir() -> Path:
    var = Path(os.environ.get("RAG_VAR_DIR", ROOT / "var")).resolve()
    return var / "nats" / "auth"


def new_seed() -> bytes:
    """A fresh nkey user seed (``SU…``)."""
    import nkeys

    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    """The public key (``U…``) of a user seed."""
    import nkeys

    return nkeys.from_seed(bytearray(seed)).public_key.decode()


def _write_secret(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def producer_permissions(name: str, teams: list[str], prefix: str = "") -> dict[str, Any]:
    """What a producer's connection may publish and subscribe to."""
    tokens = [team_token(t) for t in teams]
    return {
        "publish": {
            "allow": [
                f"{prefix}{TEAM_SUBJECTS}.{tok}.{t}.{name}" for tok in tokens for t in SUBJECT_TYPES
            ]
        },
        "subscribe": {
            "allow": [f"{prefix}{TEAM_SUBJECTS}.{tok}.document.>" for tok in tokens]
            + [f"_INBOX.{name}.>"]
        },
    }


class BusAuth:
    """The credentials directory (see the module docstring)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_dir()

    @property
    def conf(self) -> Path:
        return self.path / "auth.conf"

    def seed_file(self, user: str) -> Path:
        """The seed of a service user (``consumer``, ``operator``) or of a producer."""
        if user in SERVICE_USERS:
            return self.path / f"{user}.nk"
        return self.path / "producers" / f"{user}.nk"

    def ensure_service_users(self) -> None:
        """The consumer's and the operators' seeds (created once) and ``auth.conf``."""
        for user in SERVICE_USERS:
            if not self.seed_file(user).exists():
                _write_secret(self.seed_file(user), new_seed())
        self.render()

    def producers(self) -> dict[str, dict[str, Any]]:
        registry = self.path / "producers.json"
        return json.loads(registry.read_text()) if registry.exists() else {}

    def _save(self, producers: dict[str, dict[str, Any]]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "producers.json").write_text(json.dumps(producers, indent=2, sort_keys=True))
        self.render()

    def issue(self, name: str, teams: list[str], subject_prefix: str = "") -> Path:
        """A producer credential for ``teams`` (a new seed, replacing any of that name)."""
        if not PRODUCER_NAME.fullmatch(name) or name in SERVICE_USERS:
            raise ValueError(
                f"producer name {name!r}: 1-64 of a-z, 0-9, _ and -, starting with a letter, "
                f"not {' or '.join(SERVICE_USERS)}"
            )
        teams = list(dict.fromkeys(t.strip() for t in teams if t.strip()))
        if not teams:
            raise ValueError("a producer needs at least one team (--teams)")
        seed = new_seed()
        _write_secret(self.seed_file(name), seed)
        producers = self.producers()
        producers[name] = {
            "public_key": public_key(seed),
            "teams": teams,
            "subject_prefix": subject_prefix,
            "issued_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        self._save(producers)
        return self.seed_file(name)

    def revoke(self, name: str) -> bool:
        producers = self.producers()
        if producers.pop(name, None) is None:
            return False
        self.seed_file(name).unlink(missing_ok=True)
        self._save(producers)
        return True

    def render(self) -> str:
        """Write ``auth.conf`` from the seeds and the registry; its text."""
        users: list[dict[str, Any]] = [
            {"nkey": public_key(self.seed_file(u).read_bytes().strip())}
            for u in SERVICE_USERS
            if self.seed_file(u).exists()
        ]
        for name, p in sorted(self.producers().items()):
            users.append(
                {
                    "nkey": p["public_key"],
                    "permissions": producer_permissions(
                        name, p["teams"], p.get("subject_prefix", "")
                    ),
                }
            )
        # JSON is valid NATS configuration syntax.
        text = (
            "# Written by python -m batch_ingest.bus_auth; edit producers with it, not here.\n"
            f"authorization {json.dumps({'users': users}, indent=2)}\n"
        )
        self.path.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(text)
        return text


def reload_server(pid_file: Path) -> bool:
    """Ask a running nats-server to reload its configuration; False if none runs."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True


def connect_options(
    seed_file: str | Path | None, inbox_prefix: str | None = None, tls: Any = None
) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for a credential (none: anonymous)."""
    out: dict[str, Any] = {}
    if seed_file:
        out["nkeys_seed"] = str(seed_file)
    if inbox_prefix:
        out["inbox_prefix"] = inbox_prefix
    if tls is not None:
        out["tls"] = tls
    return out


def local_options(user: str = "operator") -> dict[str, Any]:
    """``nats.connect`` arguments with the local seed of a service user that
    scripts/services.py made (none when it did not: a bus without users)."""
    seed = BusAuth().seed_file(user)
    return connect_options(seed if seed.exists() else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="default: var/nats/auth")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="the consumer's and operators' seeds (kept if present)")
    issue = sub.add_parser("issue", help="a producer credential bound to teams")
    issue.add_argument("name")
    issue.add_argument("--teams", required=True, help="comma-separated team ids")
    issue.add_argument("--subject-prefix", default="", help="the consumer's --subject-prefix")
    revoke = sub.add_parser("revoke", help="remove a producer")
    revoke.add_argument("name")
    sub.add_parser("list", help="the producers and their teams")
    args = parser.parse_args(argv)
    auth = BusAuth(args.dir)
    pid_file = auth.path.parent.parent / "nats.pid"
    try:
        if args.command == "init":
            auth.ensure_service_users()
            print(f"{auth.seed_file('consumer')}, {auth.seed_file('operator')}, {auth.conf}")
        elif args.command == "issue":
            seed = auth.issue(args.name, args.teams.split(","), args.subject_prefix)
            print(f"issued {args.name} for {args.teams}: seed {seed}")
            print(f'connect with nkeys_seed="{seed}", inbox_prefix="_INBOX.{args.name}"')
        elif args.command == "revoke":
            if not auth.revoke(args.name):
                print(f"no producer {args.name!r}", file=sys.stderr)
                return 2
            print(f"revoked {args.name}")
        else:
            for name, p in sorted(auth.producers().items()):
                print(f"{name}\t{','.join(p['teams'])}\t{p['issued_at']}\t{p['public_key']}")
            return 0
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if reload_server(pid_file):
        print("nats-server reloaded")
    else:
        print(f"no running nats-server ({pid_file}); the next start reads {auth.conf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
