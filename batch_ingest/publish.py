"""Publish one document to the bus as a producer would: a ``doc.upserted`` (or ``doc.deleted``)
event on the team's subject in the producer's name (``rag.team.<team>.<type>.<name>``), with
a producer credential (``python -m batch_ingest.bus_auth issue NAME --teams TEAM``), waiting
for JetStream's acknowledgement and, with ``--wait``, for the consumer's ``indexed`` notice.

    python -m batch_ingest.publish --seed var/nats/auth/producers/demo.nk --team dao_greenfood \\
        --doc-id note-1 --title "Solar" --text "The co-op's solar array feeds the cold store."
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from batch_ingest.bus_auth import connect_options
from batch_ingest.event_types import event_subject, notice_subject


def make_event(args: argparse.Namespace) -> dict[str, Any]:
    payload: dict[str, Any] = {"doc_id": args.doc_id, "revision": args.revision}
    if not args.delete:
        payload |= {"text": args.text, "title": args.title or args.doc_id}
    return {
        "event_id": uuid.uuid4().hex,
        "ts": int(time.time() * 1000),
        "domain": "doc",
        "type": "doc.deleted" if args.delete else "doc.upserted",
        "version": "1.0",
        "actor": {"id": args.actor, "kind": "service"},
        "payload": payload,
        "meta": {"team_id": args.team, "trace_id": uuid.uuid4().hex},
    }


async def publish(args: argparse.Namespace) -> int:
    import nats

    name = Path(args.seed).stem if args.seed else None
    nc = await nats.connect(
        args.url,
        allow_reconnect=False,
        **connect_options(args.seed, inbox_prefix=f"_INBOX.{name}" if name else None),
    )
    event = make_event(args)
    noticed = asyncio.Event()

    async def on_notice(msg: Any) -> None:
        if json.loads(msg.data).get("event_id") == event["event_id"]:
            noticed.set()

    kind = "deleted" if args.delete else "indexed"
    if args.wait:
        await nc.subscribe(notice_subject(args.team, kind, args.subject_prefix), cb=on_notice)
    # A producer's credential may publish only on subjects that end with its name.
    subject = event_subject(args.team, event["type"], args.subject_prefix, producer=name or "")
    started = time.perf_counter()
    try:
        ack = await nc.jetstream().publish(
            subject,
            json.dumps(event).encode(),
            headers={"Nats-Msg-Id": event["event_id"]},
            timeout=args.timeout,
        )
    except Exception as exc:  # noqa: BLE001 (said and exit 1)
        print(
            f"not accepted on {subject}: {type(exc).__name__}: {exc} (a credential for "
            f"another team, or no stream: is the consumer running?)",
            file=sys.stderr,
        )
        await nc.close()
        return 1
    print(f"published {event['event_id']} on {subject} (stream {ack.stream}, seq {ack.seq})")
    code = 0
    if args.wait:
        try:
            await asyncio.wait_for(noticed.wait(), args.timeout)
            print(f"{kind} after {time.perf_counter() - started:.2f} s")
        except TimeoutError:
            print(f"no {kind} notice within {args.timeout:g} s", file=sys.stderr)
            code = 1
    await nc.close()
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="nats://127.0.0.1:4222")
    p.add_argument("--seed", help="the producer's nkey seed file (bus_auth issue)")
    p.add_argument("--team", required=True)
    p.add_argument("--doc-id", required=True)
    p.add_argument("--title", default="")
    p.add_argument("--text", default="")
    p.add_argument("--delete", action="store_true", help="a doc.deleted event")
    p.add_argument("--revision", type=int, default=int(time.time() * 1000))
    p.add_argument("--actor", default="publish-cli")
    p.add_argument("--subject-prefix", default="")
    p.add_argument("--wait", action="store_true", help="until the consumer's notice")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    if not args.delete and not args.text.strip():
        p.error("--text is required (or --delete)")
    return asyncio.run(publish(args))


if __name__ == "__main__":
    raise SystemExit(main())
