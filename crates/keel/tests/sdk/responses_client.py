"""Drives keel's /v1/responses with the official `openai` SDK.

Run by crates/keel/tests/openai_sdk.rs with OPENAI_BASE_URL=<keel>/v1.
Does a client tool round trip (function_call -> function_call_output ->
final text) twice: non-streamed and streamed. Every streamed event is also
validated against the Open Responses schema (`openresponses-types`).
Prints one JSON object with what it saw; the Rust test asserts on it.
"""
import json
import sys

from openai import OpenAI
import openresponses_types as ort

TOOL = {
    "type": "function",
    "name": "get_furnace_temp",
    "description": "Current temperature of a furnace, in degrees Celsius.",
    "parameters": {
        "type": "object",
        "properties": {"furnace_id": {"type": "string"}},
        "required": ["furnace_id"],
        "additionalProperties": False,
    },
    "strict": True,
}

READINGS = {"F1": 1380, "F2": 1450}

# Open Responses streaming event classes, by event type.
SCHEMAS = {
    "response.created": ort.ResponseCreatedStreamingEvent,
    "response.in_progress": ort.ResponseInProgressStreamingEvent,
    "response.completed": ort.ResponseCompletedStreamingEvent,
    "response.failed": ort.ResponseFailedStreamingEvent,
    "response.output_item.added": ort.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": ort.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": ort.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": ort.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": ort.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": ort.ResponseOutputTextDoneStreamingEvent,
    "response.function_call_arguments.delta": ort.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": ort.ResponseFunctionCallArgumentsDoneStreamingEvent,
}


def get_furnace_temp(furnace_id: str) -> str:
    return str(READINGS[furnace_id])


def call_outputs(output):
    """Runs the client tool for each function_call item."""
    calls = [item for item in output if item.type == "function_call"]
    items = []
    for c in calls:
        args = json.loads(c.arguments)
        items.append({"type": "function_call_output", "call_id": c.call_id,
                      "output": get_furnace_temp(**args)})
    return calls, items


def non_streamed(client):
    first = client.responses.create(model="default", input="How hot is furnace F2?",
                                    tools=[TOOL], temperature=0.1, max_output_tokens=400,
                                    metadata={"case": "non-streamed"})
    calls, outputs = call_outputs(first.output)
    second = client.responses.create(model="default", previous_response_id=first.id,
                                     input=outputs, tools=[TOOL])
    return {
        "first_id": first.id,
        "first_status": first.status,
        "calls": [{"name": c.name, "arguments": json.loads(c.arguments), "call_id": c.call_id}
                  for c in calls],
        "second_id": second.id,
        "second_status": second.status,
        "previous_response_id": second.previous_response_id,
        "text": second.output_text,
        "usage_total": second.usage.total_tokens if second.usage else None,
    }


def consume(stream, validation_errors):
    events = []
    for event in stream:
        raw = event.to_dict()
        schema = SCHEMAS.get(raw["type"])
        if schema is None:
            validation_errors.append(f"unexpected event type {raw['type']}")
        else:
            try:
                schema.model_validate(raw)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                validation_errors.append(f"{raw['type']}: {e}")
        events.append(event)
    return events


def streamed(client):
    errors = []
    first_events = consume(client.responses.create(
        model="default", input="How hot is furnace F1?", tools=[TOOL], stream=True), errors)
    first = first_events[-1].response
    calls, outputs = call_outputs(first.output)
    second_events = consume(client.responses.create(
        model="default", previous_response_id=first.id, input=outputs, tools=[TOOL],
        stream=True), errors)
    second = second_events[-1].response
    deltas = "".join(e.delta for e in second_events if e.type == "response.output_text.delta")
    return {
        "first_types": [e.type for e in first_events],
        "second_types": [e.type for e in second_events],
        "sequence_numbers": [e.sequence_number for e in first_events]
        + [e.sequence_number for e in second_events],
        "calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls],
        "first_id": first.id,
        "second_id": second.id,
        "second_status": second.status,
        "deltas": deltas,
        "text": second.output_text,
        "schema_errors": errors,
    }


def models(client):
    return [m.id for m in client.models.list()]


def main():
    client = OpenAI()
    result = {"models": models(client), "non_streamed": non_streamed(client),
              "streamed": streamed(client)}
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
