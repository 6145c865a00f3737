"""Small real transformer checkpoints built on the fly (random weights), so tests and
benchmarks exercise the real loading and batching code of the reranker and of the
FlagEmbedding backends (BGE-M3, bge-reranker-v2-m3: XLM-RoBERTa with a tokenizer trained
here) without downloading weights (none ship offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_tiny_cross_encoder(
    path: Path, seed: int = 0, *, hidden: int = 32, layers: int = 2, heads: int = 2
) -> Path:
    """A BERT sequence classifier (one logit; 2 layers of 32 by default, ``hidden=384,
    layers=6, heads=12`` is the size of MiniLM-L6) with the MiniLM tokenizer, saved to
    ``path`` in the Hugging Face layout that ``AutoModelForSequenceClassification`` loads."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from deployments.models.embedding import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden if hidden <= 64 else 4 * hidden,
        max_position_embeddings=512,
    )
    config.num_labels = 1  # one relevance logit (a PretrainedConfig field)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_embedder(
    path: Path, seed: int = 0, *, hidden: int = 64, layers: int = 2, heads: int = 2
) -> Path:
    """A BERT encoder (``hidden``-d vectors, 64 by default: another size than MiniLM's 384)
    with the MiniLM tokenizer, saved to ``path`` in the Hugging Face layout that
    ``EmbedderCore`` (backend ``transformers``, mean pooling) loads: a second embedding model
    that ships offline, for tests of a change of model."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from deployments.models.embedding import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden if hidden <= 64 else 4 * hidden,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# Words of the gateway's own domain (English and Ukrainian), from which ``_corpus`` makes the
# text the tiny XLM-R tokenizers are trained on: generated here, so the builders need no file
# of the repository (the package ships without docs/) and no download.
_WORDS = (
    "the a of and to in is for on with by from that this it as are be or an at which "
    "agent agents team teams project projects channel channels member members document "
    "documents chunk chunks vector vectors dense sparse lexical search query queries passage "
    "passages index indexes milvus neo4j graph node nodes edge edges embed embedding "
    "embeddings rerank reranker score scores model models batch batches token tokens "
    "gateway ingress retriever request requests response cache store stores filter filters "
    "access policy tenant tenants user users group groups role roles audit log event events "
    "stream ingest ingestion reindex version versions schema field fields shard replica "
    "replicas device gpu cpu memory latency throughput keeps stores uses returns finds "
    "searches writes reads every each all some many one two three new old fast slow short "
    "long which what who where when how why does do keep use find "
    "проєкт проєкти команда команди агент агенти пошук документ документи використовують "
    "для та і в на з що як де граф вектор модель запит відповідь"
)


def _corpus(seed: int, lines: int = 600) -> list[str]:
    import random

    rng = random.Random(seed)
    words = _WORDS.split()
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 16))).capitalize()
        + rng.choice(".?!,:;")
        for _ in range(lines)
    ] + [" ".join(words), " ".join(words).upper()]


# Every character gets a piece of its own, so text of these alphabets never maps to <unk>.
_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    ".,;:!?'\"()[]{}<>-_/+*=&%$#@"
    "абвгґдеєжзиіїйклмнопрстуфхцчшщьюяАБВГҐДЕЄЖЗИІЇЙКЛМНОПРСТУФХЦЧШЩЬЮЯ"
)


def build_xlmr_tokenizer(seed: int = 0, vocab_size: int = 800) -> Any:
    """An XLM-RoBERTa tokenizer (SentencePiece-style Unigram, ``<s> A </s></s> B </s>``)
    trained here on generated text in a fraction of a second: the XLM-R special tokens
    ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3 (the ids ``XLMRobertaConfig`` assumes),
    ``<mask>`` 4."""
    import json

    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from tokenizers.models import Unigram
    from transformers import XLMRobertaTokenizer

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trained = Tokenizer(Unigram())
    trained.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁")]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        unk_token="<unk>",
        initial_alphabet=list(_ALPHABET),
        show_progress=False,
    )
    trained.train_from_iterator(_corpus(seed), trainer=trainer)
    vocab = [
        (piece, float(score)) for piece, score in json.loads(trained.to_str())["model"]["vocab"]
    ]
    assert [piece for piece, _ in vocab[: len(specials)]] == specials
    # The transformers 5 class builds the XLM-R pipeline (Metaspace, pair template) itself.
    return XLMRobertaTokenizer(vocab=vocab)


def _xlmr_config(vocab_size: int, hidden: int, layers: int, heads: int) -> Any:
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden if hidden <= 64 else 4 * hidden,
        # As XLM-R: 512 positions after the padding offset of 2.
        max_position_embeddings=514,
        type_vocab_size=1,
        # Wider than the default 0.02: random weights of that scale give nearly the same
        # output for every text (scores equal to 1e-4), which tests of order cannot tell apart.
        initializer_range=0.3,
    )


def build_tiny_m3(
    path: Path, seed: int = 0, *, hidden: int = 32, layers: int = 2, heads: int = 2
) -> Path:
    """A BGE-M3 folder with random weights: an ``XLMRobertaModel`` (2 layers of 32 by default;
    ``hidden=1024, layers=24, heads=16`` is BGE-M3's size), the tokenizer of
    ``build_xlmr_tokenizer`` and BGE-M3's two heads beside it, ``colbert_linear.pt``
    (Linear(hidden, hidden)) and ``sparse_linear.pt`` (Linear(hidden, 1)), which
    FlagEmbedding's ``BGEM3FlagModel`` loads. The sparse head has a positive bias, so most
    tokens get a positive lexical weight (a random head would zero about half of them)."""
    import torch
    from transformers import XLMRobertaModel

    tokenizer = build_xlmr_tokenizer(seed)
    torch.manual_seed(seed)
    model = XLMRobertaModel(_xlmr_config(len(tokenizer), hidden, layers, heads))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    colbert = torch.nn.Linear(hidden, hidden)
    sparse = torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        sparse.weight.mul_(0.1)
        sparse.bias.fill_(0.5)
    torch.save(colbert.state_dict(), Path(path) / "colbert_linear.pt")
    torch.save(sparse.state_dict(), Path(path) / "sparse_linear.pt")
    return path


def build_tiny_xlmr_reranker(
    path: Path, seed: int = 0, *, hidden: int = 32, layers: int = 2, heads: int = 2
) -> Path:
    """An XLM-RoBERTa sequence classifier with one logit and random weights (2 layers of 32
    by default; ``hidden=1024, layers=24, heads=16`` is bge-reranker-v2-m3's size) with the
    tokenizer of ``build_xlmr_tokenizer``: the layout of bge-reranker-v2-m3, which
    FlagEmbedding's ``FlagReranker`` loads."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    tokenizer = build_xlmr_tokenizer(seed)
    torch.manual_seed(seed)
    config = _xlmr_config(len(tokenizer), hidden, layers, heads)
    config.num_labels = 1  # one relevance logit (a PretrainedConfig field)
    XLMRobertaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
