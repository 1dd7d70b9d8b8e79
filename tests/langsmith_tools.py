"""Tools for the LangSmith tests: each traces a step of its own inside the tool.

The sync tool also calls a chat model (a LangChain run nested in the tool); the async
one is an ``async def`` tool with an async ``@traceable`` step.
"""

from __future__ import annotations

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool
from langsmith import traceable


@traceable(name="lookup_step")
def lookup_step(term: str) -> str:
    return f"found {term}"


@traceable(name="alookup_step")
async def alookup_step(term: str) -> str:
    return f"found {term}"


@tool
def traced_lookup(term: str) -> str:
    """Looks a term up in a traced step, then asks a model about it."""
    found = lookup_step(term)
    answer = FakeListChatModel(responses=["noted"], name="nested_model").invoke(found)
    return f"{found}, {answer.content}"


@tool
async def atraced_lookup(term: str) -> str:
    """Looks a term up in a traced async step."""
    return await alookup_step(term)
