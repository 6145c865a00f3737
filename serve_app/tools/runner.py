"""One way to run a tool, shared by ``POST /tools/{function}`` and the MCP server: validate
the LLM's arguments, complete them with the caller's tenancy into the full request, call the
same service the HTTP route calls (so policy, audit and errors are the route's own), and
render text when asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from deployments.errors import InvalidInput, NotFound
from serve_app.enrich.service import EnrichService
from serve_app.graph.service import GraphTools
from serve_app.request import RequestContext
from serve_app.search.service import SearchService
from serve_app.tools.catalog import BY_FUNCTION, TOOLS, ToolSpec
from serve_app.tools.tenancy import ToolTenancy
from serve_app.tools.text import render

# Keys an LLM might invent to pick a tenant; tool arguments never carry them.
IDENTITY_KEYS = ("team_id", "dao_id", "microdao_id", "user_id", "agent_id", "visibility", "mode")


@dataclass(frozen=True)
class ToolResult:
    response: BaseModel
    # The text rendering when the arguments asked for format "text", else None.
    text: str | None = None


def tool(function: str) -> ToolSpec:
    """The tool of a function name (``rag_search_docs``) or dotted name (``rag.search_docs``).

    Raises:
        NotFound: no such tool.
    """
    spec = BY_FUNCTION.get(function)
    if spec is None:
        raise NotFound(
            f"no tool {function!r}; the tools are {', '.join(t.function for t in TOOLS)}",
            hint="GET /tools lists them",
        )
    return spec


# Objects of the arguments whose null members mean "not given", like the top level's.
NULLABLE_MEMBERS = ("filters", "args")


def without_nulls(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` without the members a strict caller sets to null because it must send
    every property (``GET /tools?format=openai-strict``): null means "not given", so the
    server's default applies. Cypher ``params`` keep theirs (a null there is a value)."""
    out = {k: v for k, v in arguments.items() if v is not None}
    for name in NULLABLE_MEMBERS:
        member = out.get(name)
        if isinstance(member, dict):
            out[name] = {k: v for k, v in member.items() if v is not None}
    return out


def invalid_arguments(exc: ValidationError, prefix: str = "") -> InvalidInput:
    """One InvalidInput naming every bad argument (the first one as its field)."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err.get("loc", ())) or prefix or "arguments"
        message = err.get("msg", "")
        if err.get("type") == "extra_forbidden":
            message = "unknown argument"
            if field.split(".")[-1] in IDENTITY_KEYS:
                message += "; the team, user and agent come from the credential (X-Team-Id)"
        problems.append((field, message))
    text = "; ".join(f"{field}: {msg}" for field, msg in problems)
    return InvalidInput(
        f"invalid arguments: {text}",
        field=problems[0][0] if problems else "arguments",
        fields=[{"field": f, "problem": m} for f, m in problems],
        hint="GET /tools lists each tool's argument schema",
    )


class ToolRunner:
    """Runs the catalog's tools on the services their HTTP routes call."""

    def __init__(self, *, search: SearchService, enrich: EnrichService, graph: GraphTools) -> None:
        self.search = search
        self.enrich = enrich
        self.graph = graph

    async def call(
        self,
        function: str,
        arguments: Mapping[str, Any] | None,
        rc: RequestContext,
        headers: Mapping[str, str],
    ) -> ToolResult:
        """Run one tool for the verified caller of ``rc``.

        Raises:
            NotFound: no such tool. InvalidInput: bad arguments or an ambiguous team.
            Forbidden, BackendUnavailable, ...: as the tool's HTTP route.
        """
        spec = tool(function)
        try:
            args = spec.args.model_validate(without_nulls(arguments or {}))
        except ValidationError as exc:
            raise invalid_arguments(exc) from None
        tenancy = ToolTenancy.resolve(rc.principal, headers)
        try:
            request = spec.build(args, tenancy)
        except ValidationError as exc:
            raise invalid_arguments(exc) from None
        response = await spec.call(self, request, rc)
        text = render(response) if getattr(args, "format", "json") == "text" else None
        return ToolResult(response, text)
