"""rag.enrich_answer: cite the caller's own documents after the claims of a draft answer.

The draft is split into claims (its sentences). Each claim is searched with the pipeline of
rag.search_docs (``serve_app.search.retrieval.Retrieval``) inside one ``AccessContext``, all claims
embedded in one embedder call. Whether a passage supports a claim is decided on an absolute
score (the fused search score is min-max normalised per query, so it says nothing across
queries):

    support = dense_weight * max(cosine, 0) + (1 - dense_weight) * coverage

where ``cosine`` is the dense score of claim and passage and ``coverage`` the share of the
claim's content words found in the passage; a passage supports the claim when ``support``
reaches ``enrich.min_support`` and ``coverage`` reaches ``enrich.min_term_coverage``. Without
the embedder, ``support`` is the coverage alone. This is evidence retrieval, not fact checking:
no model reads the passage to confirm the claim (no LLM in the hot path).

Cited documents are chosen greedily (the one supporting most uncited claims first) up to
``max_docs``, numbered in order of first citation, and ``[n]`` markers are inserted after the
sentences they support; the rest of the draft is returned byte for byte.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batch_ingest.chunks import strip_header
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord, SearchFilter, SearchHit
from serve_app.access.context import AccessContext
from serve_app.audit.log import request_audit, scope_resource
from serve_app.audit.recorder import AuditRecorder
from serve_app.contracts import ProfileInfo
from serve_app.enrich.claims import Sentence, content_terms, extract_claims, insert_markers
from serve_app.enrich.contracts import (
    EnrichAnswerRequest,
    EnrichAnswerResponse,
    EnrichClaim,
    EnrichSource,
)
from serve_app.profiles import DEFAULT_PROFILES, ProfileSet, narrower_mode
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.retrieval import Retrieval, RetrievalResult
from serve_app.search.scope import search_scope
from serve_app.search.snippets import best_snippet

if TYPE_CHECKING:
    from serve_app.access.policy import Policy
    from serve_app.request import RequestContext
    from serve_app.settings import GatewaySettings


@dataclass
class _Support:
    """The best passage of one document for one claim."""

    score: float
    coverage: float
    cosine: float | None
    hit: SearchHit


@dataclass
class _ClaimResult:
    sentence: Sentence
    best: float = 0.0
    # (doc_type, doc_id) → the document's best supporting passage.
    supports: dict[tuple[str, str], _Support] = field(default_factory=dict)


def _doc_key(chunk: ChunkRecord) -> tuple[str, str]:
    return (chunk.doc_type, chunk.doc_id)


@dataclass
class _Plan:
    """What the caller's access and agent profile make of one enrich request."""

    ctx: AccessContext
    flt: SearchFilter
    info: ProfileInfo
    agent_name: str
    rag_mode: str
    light: bool
    # The retrieval method of every claim's search.
    mode: str
    max_docs: int
    min_support: float


async def enrich_answer(
    retrieval: Retrieval,
    settings: GatewaySettings,
    policy: Policy,
    req: EnrichAnswerRequest,
    rc: RequestContext,
    profiles: ProfileSet | None = None,
) -> EnrichAnswerResponse:
    """The enriched answer of ``req`` for the caller of ``rc`` (audit is the caller's job):
    plan (access, profile, bounds), the claims of the draft, one search per claim, each
    passage's support, the documents cited, the response.

    Raises:
        Forbidden: the team, mode, doc types or project are not granted (before searching).
        InvalidInput: the draft is longer than ``enrich.max_draft_chars``.
        BackendUnavailable: the vector store does not answer.
    """
    plan = _plan(settings, policy, req, rc, profiles or DEFAULT_PROFILES)
    if plan.rag_mode == "off":
        return EnrichAnswerResponse(
            enriched_answer=req.draft_answer,
            sources=[],
            claims=[],
            unsupported_claims=[],
            mode="off",
            profile=plan.info,
            notice=f"RAG is off for profile {plan.agent_name!r}: the draft was not checked",
            took_ms=rc.elapsed_ms,
            trace_id=rc.trace_id,
        )
    ecfg = settings.enrich
    found = extract_claims(req.draft_answer, ecfg.min_claim_chars, ecfg.stem_chars)
    claims, skipped = found[: ecfg.max_claims], max(0, len(found) - ecfg.max_claims)
    outcomes = await _search_claims(retrieval, settings, req, plan, claims)
    degraded: list[str] = []
    for outcome in outcomes:
        degraded.extend(r for r in outcome.degraded if r not in degraded)
    results = _supports(settings, plan, claims, outcomes)
    chosen = _choose_documents(results, plan.max_docs)
    numbers, cited = _citations(results, chosen, ecfg.max_markers_per_claim)
    sources = _sources(results, cited, numbers, settings.search.snippet_chars)
    out_claims, markers = _claims_out(results, cited, numbers)
    modes = [o.mode for o in outcomes]
    used = "bm25" if modes and all(m == "bm25" for m in modes) else plan.mode
    return EnrichAnswerResponse(
        degraded=bool(degraded),
        degraded_reasons=degraded,
        enriched_answer=insert_markers(req.draft_answer, markers),
        sources=sources,
        claims=out_claims,
        unsupported_claims=[c.text for c in out_claims if not c.supported],
        skipped_claims=skipped,
        mode=used,
        profile=plan.info,
        took_ms=rc.elapsed_ms,
        trace_id=rc.trace_id,
    )


def _plan(
    settings: GatewaySettings,
    policy: Policy,
    req: EnrichAnswerRequest,
    rc: RequestContext,
    profiles: ProfileSet,
) -> _Plan:
    """Access first, exactly as rag.search_docs: the team's rights narrowed to the mode;
    then the agent's profile (light: its one method, no rerank; strict: its min_support
    when higher) and the draft's bound."""
    ecfg, scfg = settings.enrich, settings.search
    scope = search_scope(
        rc,
        policy,
        profiles,
        team_id=req.team_id,
        user_id=req.user_id,
        agent_id=req.agent_id,
        visibility=req.visibility,
        filters=req.filters,
    )
    ctx, flt, agent = scope.ctx, scope.flt, scope.agent
    rag_mode = narrower_mode(agent.profile.rag_mode, req.rag_mode)
    clamped = ["rag_mode"] if req.rag_mode and rag_mode != req.rag_mode else []
    max_docs = min(req.max_docs, agent.profile.max_docs_per_query)
    if max_docs < req.max_docs:
        clamped.append("max_docs")
    info = ProfileInfo(name=agent.name, rag_mode=rag_mode, clamped=clamped)
    if len(req.draft_answer) > ecfg.max_draft_chars:
        raise InvalidInput(
            f"draft_answer is {len(req.draft_answer)} characters; the limit is "
            f"{ecfg.max_draft_chars}",
            hint="send a shorter draft or split it into several requests",
            field="draft_answer",
        )
    light = rag_mode == "light"
    min_support = ecfg.min_support
    if not light and agent.profile.min_support is not None:
        min_support = max(min_support, agent.profile.min_support)
    return _Plan(
        ctx=ctx,
        flt=flt,
        info=info,
        agent_name=agent.name,
        rag_mode=rag_mode,
        light=light,
        mode=agent.profile.light_method if light else scfg.mode,
        max_docs=max_docs,
        min_support=min_support,
    )


async def _search_claims(
    retrieval: Retrieval,
    settings: GatewaySettings,
    req: EnrichAnswerRequest,
    plan: _Plan,
    claims: list[Sentence],
) -> list[RetrievalResult]:
    """One search per claim inside the plan's scope, all claims embedded in one call and
    searched as one read (the Retriever checks its in-memory index once for them)."""
    ecfg, scfg = settings.enrich, settings.search
    queries = [c.text[: scfg.max_query_chars] for c in claims]
    vectors: list[list[float] | None] = [None] * len(claims)
    embed_error: str | None = None
    if claims and plan.mode in ("hybrid", "dense"):
        try:
            embedded = await retrieval.queries.embed(queries)
            vectors = [[float(x) for x in v] for v in embedded]
        except BackendUnavailable as exc:
            embed_error = exc.message  # every claim's search falls back to BM25 and says so

    limit = asyncio.Semaphore(ecfg.concurrency)
    read_id = uuid.uuid4().hex

    async def retrieve(i: int) -> RetrievalResult:
        search = SearchDocsRequest(
            team_id=req.team_id,
            query=queries[i],
            top_k=ecfg.candidates_per_claim,
            user_id=req.user_id,
            agent_id=req.agent_id,
            filters=req.filters,
            visibility=req.visibility,
            rerank=None if ecfg.rerank and not plan.light else False,
        )
        async with limit:
            return await retrieval.run(
                search,
                plan.ctx,
                plan.flt,
                ecfg.candidates_per_claim,
                plan.mode,
                vector=vectors[i],
                embed_error=embed_error,
                read_id=read_id,
                # A claim's support is judged per passage: a repeat adds no evidence.
                near_duplicates="drop",
            )

    outcomes = await asyncio.gather(
        *(retrieve(i) for i in range(len(claims))), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in outcomes if isinstance(o, RetrievalResult)]


def _supports(
    settings: GatewaySettings,
    plan: _Plan,
    claims: list[Sentence],
    outcomes: list[RetrievalResult],
) -> list[_ClaimResult]:
    """Per claim, each document's best supporting passage (module docstring: ``support``
    from the cosine and the claim's term coverage) and the claim's best score."""
    ecfg = settings.enrich
    dense_usable = settings.milvus.metric_type != "L2"
    term_cache: dict[str, set[str]] = {}
    results: list[_ClaimResult] = []
    for sentence, outcome in zip(claims, outcomes, strict=True):
        used_mode = outcome.mode
        result = _ClaimResult(sentence)
        wanted = content_terms(sentence.text, ecfg.stem_chars)
        for hit in outcome.hits:
            if not plan.ctx.may_see(hit.chunk):  # _retrieve filtered already; never cite past it
                continue
            cid = hit.chunk.chunk_id
            if cid not in term_cache:
                term_cache[cid] = content_terms(hit.chunk.text, ecfg.stem_chars)
            coverage = len(wanted & term_cache[cid]) / len(wanted)
            cosine = hit.scores.get("dense") if dense_usable and used_mode != "bm25" else None
            if used_mode != "bm25" and dense_usable:
                dense = min(max(cosine or 0.0, 0.0), 1.0)
                score = ecfg.dense_weight * dense + (1 - ecfg.dense_weight) * coverage
            else:
                score = coverage
            result.best = max(result.best, score)
            if score < plan.min_support or coverage < ecfg.min_term_coverage:
                continue
            key = _doc_key(hit.chunk)
            current = result.supports.get(key)
            if current is None or score > current.score:
                result.supports[key] = _Support(score, coverage, cosine, hit)
        results.append(result)
    return results


def _citations(
    results: list[_ClaimResult], chosen: list[tuple[str, str]], max_markers: int
) -> tuple[dict[tuple[str, str], int], list[list[tuple[str, str]]]]:
    """The number of each cited document (in order of first citation) and, per claim, the
    chosen documents it cites (its best ``max_markers``), in number order."""
    numbers: dict[tuple[str, str], int] = {}
    cited: list[list[tuple[str, str]]] = []
    for result in results:
        keys = sorted(
            (k for k in chosen if k in result.supports),
            key=lambda k: -result.supports[k].score,
        )[:max_markers]
        for key in keys:
            numbers.setdefault(key, len(numbers) + 1)
        cited.append(sorted(keys, key=lambda k: numbers[k]))
    return numbers, cited


def _claims_out(
    results: list[_ClaimResult],
    cited: list[list[tuple[str, str]]],
    numbers: dict[tuple[str, str], int],
) -> tuple[list[EnrichClaim], dict[int, list[int]]]:
    """The response's claims and the markers to insert after each supported sentence."""
    out_claims: list[EnrichClaim] = []
    markers: dict[int, list[int]] = {}
    for result, keys in zip(results, cited, strict=True):
        s = result.sentence
        if keys:
            markers[s.end] = [numbers[k] for k in keys]
        out_claims.append(
            EnrichClaim(
                text=s.text,
                supported=bool(keys),
                source_ids=[k[1] for k in keys],
                markers=[numbers[k] for k in keys],
                score=round(result.best, 4),
                start=s.start,
                end=s.end,
                reason=None if keys else ("over_max_docs" if result.supports else "no_support"),
            )
        )
    return out_claims, markers


def _choose_documents(results: list[_ClaimResult], max_docs: int) -> list[tuple[str, str]]:
    """Greedy cover: the document supporting the most claims not yet cited, then the next,
    up to ``max_docs``; ties go to the higher summed support, then to the earlier claim."""
    chosen: list[tuple[str, str]] = []
    uncovered = [i for i, r in enumerate(results) if r.supports]
    while uncovered and len(chosen) < max_docs:
        tally: dict[tuple[str, str], tuple[int, float, int]] = {}
        for i in uncovered:
            for key, support in results[i].supports.items():
                n, total, first = tally.get(key, (0, 0.0, i))
                tally[key] = (n + 1, total + support.score, min(first, i))
        if not tally:
            break
        best = max(tally, key=lambda k: (tally[k][0], tally[k][1], -tally[k][2]))
        chosen.append(best)
        uncovered = [i for i in uncovered if best not in results[i].supports]
    return chosen


def _sources(
    results: list[_ClaimResult],
    cited: list[list[tuple[str, str]]],
    numbers: dict[tuple[str, str], int],
    snippet_chars: int,
) -> list[EnrichSource]:
    best: dict[tuple[str, str], tuple[_Support, str]] = {}
    for result, keys in zip(results, cited, strict=True):
        for key in keys:
            support = result.supports[key]
            if key not in best or support.score > best[key][0].score:
                best[key] = (support, result.sentence.text)
    out = []
    for key in sorted(numbers, key=numbers.__getitem__):
        support, claim = best[key]
        c = support.hit.chunk
        out.append(
            EnrichSource(
                id=c.doc_id,
                title=c.title or c.heading or c.doc_id,
                url=c.url,
                marker=numbers[key],
                team_id=c.team_id,
                doc_type=c.doc_type,
                chunk_index=c.chunk_index,
                chunk_id=c.chunk_id,
                score=round(support.score, 4),
                snippet=best_snippet(strip_header(c), claim, snippet_chars),
            )
        )
    return out


@dataclass
class EnrichService:
    """rag.enrich_answer over the shared retrieval pipeline, audited like a search."""

    settings: GatewaySettings
    policy: Policy
    retrieval: Retrieval
    recorder: AuditRecorder
    profiles: ProfileSet = DEFAULT_PROFILES

    async def enrich_answer(
        self, req: EnrichAnswerRequest, rc: RequestContext
    ) -> EnrichAnswerResponse:
        """Cite the caller's documents after the claims of ``req.draft_answer`` (search
        pipeline and scope of ``search_docs``; see serve_app/enrich/service.py); audited like it.

        Raises:
            Forbidden: the team, mode, doc types or project are not granted (before searching).
            InvalidInput: the draft exceeds ``enrich.max_draft_chars``.
        """
        audit = request_audit(req, rc.principal, "enrich", scope_resource(req), req.draft_answer)
        with self.recorder.audited(rc, audit) as allowed:
            response = await enrich_answer(
                self.retrieval, self.settings, self.policy, req, rc, self.profiles
            )
            allowed.fields = {
                "chunk_ids": [s.chunk_id for s in response.sources],
                "doc_ids": [s.id for s in response.sources],
            }
        return response
