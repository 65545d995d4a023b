"""Runs an `openai-agents` Agent whose model is keel, over /v1/responses.

Run by crates/keel/tests/openai_sdk.rs with OPENAI_BASE_URL=<keel>/v1.
The agent has one `@function_tool`; the SDK executes it when keel hands
the call back, and keel finishes the run with the result. Tracing is
disabled (it would try to reach OpenAI). Prints one JSON object.
"""
import asyncio
import json
import os

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

CALLS = []


@function_tool
def get_furnace_temp(furnace_id: str) -> str:
    """Current temperature of a furnace, in degrees Celsius."""
    CALLS.append(furnace_id)
    return {"F1": "1380", "F2": "1450"}[furnace_id]


async def run(agent, streamed):
    if streamed:
        result = Runner.run_streamed(agent, "How hot is furnace F2?")
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, "How hot is furnace F2?")
    return {
        "final_output": result.final_output,
        "tool_calls": sum(1 for i in result.new_items if isinstance(i, ToolCallItem)),
        "tool_outputs": [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)],
        "last_response_id": result.last_response_id,
    }


async def main():
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                         api_key=os.environ.get("OPENAI_API_KEY", "none"))
    agent = Agent(
        name="furnace-assistant",
        instructions="You answer questions about furnaces. Use get_furnace_temp.",
        tools=[get_furnace_temp],
        model=OpenAIResponsesModel(model="default", openai_client=client),
    )
    out = {"run": await run(agent, False), "run_streamed": await run(agent, True), "calls": CALLS}
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
