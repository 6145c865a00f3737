"""Credentials for development and operations.

An HS256 token for local testing (secret, issuer and audience from the AUTH__* variables):

    python -m serve_app.auth mint-token --sub alice --team dao_greenfood=owner,member

A new API key for a service agent (prints the key once, and the entry for the key file):

    python -m serve_app.auth new-api-key --team dao_greenfood=service --agent-id ag_ingest
"""

from __future__ import annotations

import argparse
import sys
import time

import jwt
import yaml

from serve_app.auth.api_keys import hash_key, new_key
from serve_app.settings import GatewaySettings


def team_roles(value: str) -> tuple[str, list[str]]:
    """``dao_x=owner,member`` -> ("dao_x", ["owner", "member"])."""
    team, _, roles = value.partition("=")
    if not team or not roles:
        raise argparse.ArgumentTypeError(f"expected TEAM=ROLE[,ROLE...], got {value!r}")
    return team, [r for r in roles.split(",") if r]


# The longest a minted token may live: these tokens are for development and operations.
MAX_TTL_S = 30 * 86_400


def ttl_seconds(value: str) -> int:
    """A token lifetime: whole seconds, 1 to ``MAX_TTL_S``."""
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {value!r}") from None
    if not 1 <= seconds <= MAX_TTL_S:
        raise argparse.ArgumentTypeError(
            f"must be between 1 and {MAX_TTL_S} seconds (30 days), got {seconds}"
        )
    return seconds


def mint_token(args: argparse.Namespace, settings: GatewaySettings) -> str:
    auth = settings.auth
    secret = args.secret or auth.hs256_secret.get_secret_value()
    if len(secret.encode()) < 32:
        raise SystemExit("set AUTH__HS256_SECRET (at least 32 bytes) or pass --secret")
    now = int(time.time())
    claims: dict = {
        "sub": args.sub,
        "iat": now,
        "nbf": now,
        "exp": now + args.ttl,
        auth.claims.teams: dict(args.team),
    }
    if args.issuer or auth.issuer:
        claims["iss"] = args.issuer or auth.issuer
    if args.audience or auth.audience:
        claims["aud"] = args.audience or auth.audience
    if args.group:
        claims[auth.claims.groups] = args.group
    if args.permission:
        claims[auth.claims.permissions] = args.permission
    if args.agent_id:
        claims[auth.claims.agent_id] = args.agent_id
    return jwt.encode(claims, secret, "HS256")


def new_api_key(args: argparse.Namespace, settings: GatewaySettings) -> str:
    pepper = settings.auth.api_key_pepper.get_secret_value()
    if not pepper:
        print("warning: AUTH__API_KEY_PEPPER is empty; set it before hashing", file=sys.stderr)
    key_id, key = new_key()
    entry = {
        "id": key_id,
        "hash": hash_key(key, pepper),
        "name": args.name,
        "agent_id": args.agent_id,
        "teams": dict(args.team),
    }
    if args.group:
        entry["groups"] = args.group
    if args.permission:
        entry["permissions"] = args.permission
    listing = yaml.safe_dump({"keys": [entry]}, sort_keys=False, allow_unicode=True)
    return (
        f"# API key (shown once; give it to the agent, never store it):\n# {key}\n"
        f"# Add this entry under keys: in the file of AUTH__API_KEYS_FILE:\n{listing}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.auth", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    helps = {
        "mint-token": "an HS256 token for local testing (AUTH__HS256_SECRET, issuer, audience)",
        "new-api-key": "a new API key for a service agent and its key-file entry",
    }
    for name in ("mint-token", "new-api-key"):
        sub = commands.add_parser(name, help=helps[name], description=helps[name])
        sub.add_argument(
            "--team",
            type=team_roles,
            action="append",
            required=True,
            metavar="TEAM=ROLE[,ROLE...]",
            help="a team and the roles in it (repeat for several teams)",
        )
        sub.add_argument(
            "--group", action="append", default=[], help="a group of the caller (repeatable)"
        )
        sub.add_argument(
            "--permission",
            action="append",
            default=[],
            help="a permission, e.g. ops:read or rag:route_agents (repeatable)",
        )
        sub.add_argument("--agent-id", default="", help="the agent id the credential names")
        if name == "mint-token":
            sub.add_argument("--sub", required=True, help="the subject (user or service id)")
            sub.add_argument(
                "--ttl",
                type=ttl_seconds,
                default=3600,
                help=f"lifetime in seconds, 1 to {MAX_TTL_S} (default: 3600)",
            )
            sub.add_argument("--secret", default="", help="default: AUTH__HS256_SECRET")
            sub.add_argument("--issuer", default="", help="default: AUTH__ISSUER")
            sub.add_argument("--audience", default="", help="default: AUTH__AUDIENCE")
        else:
            sub.add_argument("--name", default="", help="a name for the key in the key file")
    args = parser.parse_args(argv)
    settings = GatewaySettings()
    if args.command == "mint-token":
        print(mint_token(args, settings))
    else:
        print(new_api_key(args, settings), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
