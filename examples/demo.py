"""`make demo`: a streamed answer, a structured extraction, a tool round trip, a tool call that
waits for a human's approval and then runs once, a tool from an MCP server (a process the demo
starts over stdio), a two-turn conversation that remembers, with usage,
a question answered from a retrieved document, and a moderated request stopped before any of its
text is shown.

With `OPENAI_BASE_URL` set (and `OPENAI_API_KEY`, `OPENAI_MODEL` as needed) the demo talks to that
endpoint. Otherwise it starts a real local model (agentrt.local: llama-cpp-python's server with Gemma
3 270M), runs against it, and stops it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import anyio

import agentrt
from agentrt import Approvals, Approve, ChatModel, ModelSettings, ToolSettings
from agentrt.local import LocalModelServer
from agentrt.mcp import MCPTools, StdioServer
from agentrt.models import OpenAIChatModel
from agentrt.rag import (
    BM25Retriever,
    Document,
    EmbeddingModel,
    EmbeddingRetriever,
    InMemoryVectorIndex,
    Query,
    Retrieval,
)

from .support import HANDBOOK, ModeratedSupport, OrderTools, Support, WordListModeration

SHOP = {"shop": "Acme Rail"}
TIMETABLE_SERVER = Path(__file__).with_name("timetable_server.py")


def rule(title: str) -> None:
    print(f"\n── {title} " + "─" * max(0, 66 - len(title)))


async def run(model: ChatModel) -> None:
    support = agentrt.build(Support, model=model, variables=SHOP)

    rule("1. tokens streaming (async with await support.stream(...), then async for)")
    started = time.perf_counter()
    stamps: list[float] = []
    # `async with` closes the stream however the block ends (a `break`, an error), which releases
    # the model's stream and the conversation at once.
    async with await support.stream("user-42", "Hello! Can you help me with my order?") as stream:
        async for token in stream:
            stamps.append(time.perf_counter() - started)
            print(token, end="", flush=True)
        result = await stream.result()
    print(
        f"\n   {len(stamps)} text deltas; first after {stamps[0] * 1000:.0f} ms, last after "
        f"{stamps[-1] * 1000:.0f} ms"
        if stamps
        else "\n   (no text)"
    )
    print(
        f"   usage: {result.usage.input_tokens} in, {result.usage.output_tokens} out"
        f"{' (estimated: the server sent none in the stream)' if result.usage.estimated else ''}"
    )

    rule("2. structured extraction into a pydantic model (-> Result[Ticket])")
    extracted = await support.ticket("I need a ticket from Bern to Basel on Friday morning.")
    print(f"   {extracted.value!r}")
    print(
        f"   a validated Ticket instance: {type(extracted.value).__name__}; "
        f"usage {extracted.usage.input_tokens} in, {extracted.usage.output_tokens} out"
    )

    rule("3. a tool round trip (the model is made to call order_status)")
    tools = OrderTools()
    helpdesk = agentrt.build(
        Support,
        model=model,
        variables=SHOP,
        tools=[tools],
        tool_settings=ToolSettings(tool_choice="order_status", max_rounds=2),
    )
    answer = await helpdesk.chat("user-42", "Where is my order SO-2026-0001?")
    for execution in answer.tool_executions:
        print(f"   tool {execution.name} (arguments #{execution.arguments_hash}) -> {execution.result!r}")
    print(f"   the tool saw order_id={tools.looked_up[0]!r}" if tools.looked_up else "")
    print(f"   final answer: {answer.value[:200]!r}")
    print(
        f"   usage over {len(answer.tool_executions) + 1} requests: "
        f"{answer.usage.input_tokens} in, {answer.usage.output_tokens} out"
    )


async def approve(model: ChatModel) -> None:
    rule("4. approval before a tool runs (the turn stops, is stored, and resumes on Approve)")
    tools = OrderTools()
    gated = agentrt.build(
        Support,
        model=model,
        variables=SHOP,
        tools=[tools],
        # One round: a call after it is answered without tools, so the demo ends after one approval.
        tool_settings=ToolSettings(tool_choice="order_status", max_rounds=1, on_limit="final_answer"),
        memory=agentrt.memory.window(),
        approvals=Approvals(needs_approval={"order_status": True}),
    )
    stopped = await gated.chat("user-7", "Where is my order SO-2026-0002?")
    approval = stopped.approval
    if approval is None:
        print("   (the model answered without calling the tool)")
        return
    for call in approval.calls:
        print(f"   waiting for approval: {call.tool}({call.arguments}) as run {approval.run_id[:8]}...")
    stored = await agentrt.memory.access(gated).read("user-7")
    ran = len(tools.looked_up)
    print(f"   the tool has run {ran} time(s); the conversation holds {len(stored)} messages")
    decisions = {call.id: Approve() for call in approval.calls}
    answer = await agentrt.resume(gated, approval.run_id, decisions, memory_id="user-7")
    for execution in answer.tool_executions:
        print(f"   approved: {execution.name} -> {execution.result!r}")
    stored = await agentrt.memory.access(gated).read("user-7")
    ran = len(tools.looked_up)
    print(f"   the tool ran {ran} time(s); the conversation now holds {len(stored)} messages")
    print(f"   final answer: {(answer.value or '')[:200]!r}")


async def mcp_tool(model: ChatModel) -> None:
    rule("5. a tool from an MCP server (examples/timetable_server.py, started over stdio)")
    rail = MCPTools(StdioServer(sys.executable, [str(TIMETABLE_SERVER)], name="timetable", prefix="rail_"))
    travel = agentrt.build(
        Support,
        model=model,
        variables=SHOP,
        tools=[rail],
        tool_settings=ToolSettings(tool_choice="rail_next_train", max_rounds=1, on_limit="final_answer"),
    )
    async with rail:  # starts the server, reads its tools; stops it on the way out
        tool = rail.tools["rail_next_train"]
        print(f"   the server offers {sorted(rail.tools)}; read-only: {tool.read_only}")
        answer = await travel.chat("user-9", "When is the next train from Bern to Basel?")
    for execution in answer.tool_executions:
        print(f"   tool {execution.name} ran on the server -> {execution.result!r}")
    print(f"   final answer: {(answer.value or '')[:200]!r}")


async def remember(model: ChatModel) -> None:
    rule("6. chat memory: the second turn on a conversation carries the first")
    with tempfile.TemporaryDirectory() as directory:
        store = agentrt.memory.SQLiteStore(Path(directory) / "chat.db")
        memory = agentrt.memory.window(max_messages=20, store=store)
        support = agentrt.build(Support, model=model, variables=SHOP, memory=memory)
        await support.chat("user-7", "Hi, I am Ada. My order is SO-2026-0007.")
        second = await support.chat("user-7", "What is my name?")
        print("   the second request sent:")
        for message in second.messages:
            print(f"     {message.role:<9} {(message.text or '')[:70]!r}")
        await store.aclose()
        # A new store on the same file, as after a restart: the conversation is still there.
        reopened = agentrt.memory.SQLiteStore(Path(directory) / "chat.db")
        restarted = agentrt.build(
            Support, model=model, variables=SHOP, memory=agentrt.memory.window(store=reopened)
        )
        stored = await agentrt.memory.access(restarted).read("user-7")
        print(f"   after a restart the file holds {len(stored)} messages: two whole turns")
        await reopened.aclose()


async def retrieve(model: ChatModel, embedder: EmbeddingModel | None = None) -> None:
    rule("7. retrieval: a question answered from a retrieved document (BM25 over a handbook)")
    documents = [Document(text, {"source": name}) for name, text in HANDBOOK.items()]
    handbook = BM25Retriever(documents, k=1)
    support = agentrt.build(
        Support, model=model, variables=SHOP, retrieval=Retrieval(retrievers=[handbook], max_results=1)
    )
    question = "Can I take my bicycle on the intercity train?"
    answer = await support.chat("user-9", question)
    for source in answer.sources:
        print(f"   retrieved from {source.metadata['source']} (score {source.score:.3f}):")
        print(f"     {source.text[:90]!r}...")
    sent = answer.messages[-2]
    print(f"   the model was sent {len(sent.text or '')} characters: the question, then the document")
    print(f"   answer: {(answer.value or '')[:200]!r}")

    if embedder is not None:
        rule("7b. the same question by meaning: embeddings from the model server, cosine search")
        by_meaning = EmbeddingRetriever(embedder, InMemoryVectorIndex(), k=1)
        await by_meaning.add(documents)
        question = "Is my bike allowed on the fast train?"
        (found,) = await by_meaning.retrieve(Query(question))
        print(f"   {question!r} -> {found.metadata['source']} (cosine {found.score:.3f})")

    rule("8. moderation: a flagged request is stopped while the model starts answering")
    moderated = agentrt.build(
        ModeratedSupport, model=model, variables=SHOP, moderation_model=WordListModeration("weapon")
    )
    try:
        async with await moderated.stream("user-9", "How do I smuggle a weapon onto the train?"):
            pass  # not reached: the flag is raised by the await
    except agentrt.ModerationError as error:
        print(f"   ModerationError: flagged {error.flagged} for {', '.join(error.categories)}")
        print("   the model's stream was closed; no token was shown, nothing was stored")
    async with await moderated.stream("user-9", "Is there Wi-Fi on board?") as stream:
        text = "".join([token async for token in stream])
    print(f"   an unflagged request streams as usual: {text[:80]!r}")


async def main() -> None:
    base_url = os.environ.get("OPENAI_BASE_URL")
    if base_url:
        model = OpenAIChatModel(
            os.environ.get("OPENAI_MODEL", "gpt-4o-mini"), settings=ModelSettings(max_tokens=300)
        )
        print(f"agentrt demo against {model.endpoint} (model {model.name!r}).")
        async with model:
            await run(model)
            await approve(model)
            await mcp_tool(model)
            await remember(model)
            await retrieve(model)
        return
    print("agentrt demo against a REAL local model: llama-cpp-python's OpenAI-compatible server")
    print("running Gemma 3 270M on this machine (no network).")
    print("NOTE: this is a tiny *base* model, not a chat model: its words are meaningless. What is")
    print("real is the machinery: tokens streamed over SSE, JSON constrained to a schema and parsed")
    print("into a pydantic model, a forced tool call run by agentrt and answered, and usage numbers.")
    started = time.perf_counter()
    async with LocalModelServer() as server:
        print(f"local model server ready at {server.base_url} in {time.perf_counter() - started:.1f} s")
        model = server.chat_model(settings=ModelSettings(max_tokens=80, temperature=0.7, seed=7))
        async with model:
            await run(model)
            await approve(model)
            await mcp_tool(model)
            await remember(model)
            async with server.embedding_model() as embedder:
                await retrieve(model, embedder)
    print("\nlocal model server stopped.")


if __name__ == "__main__":
    anyio.run(main)
