"""The dead-letter stream (``RAG_EVENTS_DLQ``): list what the consumer gave up on, and replay it
once its cause is fixed (issue 34).

    python -m batch_ingest.dlq list [--team T] [--type doc.upserted] [--reason "refused"]
                                    [--since 2026-12-04T10:00:00Z] [--until ...] [--status failed]
    python -m batch_ingest.dlq replay --team T --dry-run     # what would be replayed
    python -m batch_ingest.dlq replay --team T               # republish, then remove

A replay publishes the event again on the subject it first arrived on (its team's), with the
message id ``<event_id>:replay:<dead-letter seq>`` (the stream's duplicate window then drops a
second replay of the same letter), and removes the letter from the dead-letter stream once
the event stream acknowledged it. Replaying changes nothing that was applied meanwhile: the
consumer applies a document's revision only when it is newer than the registry's. ``invalid``
letters are left alone unless ``--status invalid`` asks for them (they fail again unless the
consumer changed). Connects as an operator (``var/nats/auth/operator.nk``, ``--seed``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from batch_ingest.bus_auth import connect_options, local_options
from batch_ingest.event_types import TEAM_SUBJECTS, parse_subject
from batch_ingest.settings import ConsumerSettings


@dataclass
class DeadLetter:
    seq: int
    body: dict[str, Any]

    @property
    def team(self) -> str | None:
        """The team of the subject the event arrived on (after any deployment prefix)."""
        name = str(self.body.get("subject", ""))
        head = name.find(f"{TEAM_SUBJECTS}.")
        return parse_subject(name[head:]).team if head >= 0 else None

    @property
    def failed_at(self) -> datetime:
        return datetime.fromtimestamp(float(self.body.get("failed_at") or 0), UTC)

    def line(self) -> str:
        b = self.body
        error = str(b.get("error") or "").replace("\n", " ")[:120]
        return (
            f"{self.seq}\t{self.failed_at.isoformat(timespec='seconds')}\t{self.team or '?'}\t"
            f"{b.get('type') or '?'}\t{b.get('status')}\t{b.get('event_id') or '?'}\t{error}"
        )


@dataclass
class Filter:
    team: str | None = None
    type: str | None = None
    status: str = "failed"
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __call__(self, letter: DeadLetter) -> bool:
        b = letter.body
        return (
            (self.team is None or letter.team == self.team)
            and (self.type is None or b.get("type") == self.type)
            and (self.status == "any" or b.get("status") == self.status)
            and (self.reason is None or self.reason.lower() in str(b.get("error", "")).lower())
            and (self.since is None or letter.failed_at >= self.since)
            and (self.until is None or letter.failed_at < self.until)
        )


async def read_letters(js: Any, stream: str) -> list[DeadLetter]:
    """Every letter still in the dead-letter stream, oldest first."""
    from nats.js.errors import NotFoundError

    state = (await js.stream_info(stream)).state
    letters: list[DeadLetter] = []
    if not state.messages:
        return letters
    for seq in range(state.first_seq, state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:  # removed (replayed) letters leave gaps
            continue
        try:
            letters.append(DeadLetter(seq, json.loads(msg.data)))
        except ValueError:
            continue
    return letters


async def replay(js: Any, cfg: ConsumerSettings, letters: list[DeadLetter]) -> list[str]:
    """Republish each letter's event on its first subject, remove the letter; problems."""
    problems = []
    for letter in letters:
        b = letter.body
        event = str(b.get("event") or "")
        subject = str(b.get("subject") or "")
        if not event or not subject:
            problems.append(f"{letter.seq}: no event or subject in the letter")
            continue
        try:
            await js.publish(
                subject,
                event.encode(),
                headers={"Nats-Msg-Id": f"{b.get('event_id') or letter.seq}:replay:{letter.seq}"},
            )
        except Exception as exc:  # noqa: BLE001 (reported, the letter stays)
            problems.append(f"{letter.seq}: not republished on {subject}: {exc}")
            continue
        await js.delete_msg(cfg.dlq_stream, letter.seq)
    return problems


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def run(args: argparse.Namespace) -> int:
    import nats

    cfg = ConsumerSettings(url=args.url, stream=args.stream, subject_prefix=args.subject_prefix)
    options = connect_options(args.seed) if args.seed else local_options("operator")
    nc = await nats.connect(cfg.url, allow_reconnect=False, **options)
    try:
        js = nc.jetstream()
        chosen = [
            letter
            for letter in await read_letters(js, cfg.dlq_stream)
            if Filter(
                args.team, args.type, args.status, args.reason, _when(args.since), _when(args.until)
            )(letter)
        ]
        for letter in chosen:
            print(letter.line())
        if args.command == "list" or args.dry_run:
            verb = "would replay" if args.command == "replay" else "listed"
            print(f"{verb} {len(chosen)} dead letter(s) of {cfg.dlq_stream}", file=sys.stderr)
            return 0
        problems = await replay(js, cfg, chosen)
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"replayed {len(chosen) - len(problems)} of {len(chosen)}", file=sys.stderr)
        return 1 if problems else 0
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["list", "replay"])
    p.add_argument("--url", default=ConsumerSettings().url)
    p.add_argument("--stream", default=ConsumerSettings().stream, help="the event stream")
    p.add_argument("--subject-prefix", default="")
    p.add_argument("--seed", help="an operator's nkey seed (default: the local one)")
    p.add_argument("--team")
    p.add_argument("--type")
    p.add_argument("--status", default="failed", choices=["failed", "invalid", "any"])
    p.add_argument("--reason", help="a part of the error, any case")
    p.add_argument("--since", help="ISO 8601, dead-lettered at or after")
    p.add_argument("--until", help="ISO 8601, dead-lettered before")
    p.add_argument("--dry-run", action="store_true", help="replay: only list")
    args = p.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
