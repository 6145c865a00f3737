"""The bulk import (issue 36): files of documents written into one team at cluster speed.

    python -m batch_ingest.bulk FILE|DIR --team TEAM [--local] [--dry-run]

``sources`` reads and validates the input (JSON lines, Parquet, a folder of both), ``worker``
writes a batch through the gateway's ingestion pipeline (one per Ray Data actor, or one
in-process), ``job`` drives the passes and tallies, ``cli`` is the command. Nothing heavy is
imported here: a Ray actor unpickling the worker lowers its CPU priority first."""
