#!/usr/bin/env python3
"""A foundry's plant data as an MCP server over stdio.

The `plant` server of examples/keel.toml: furnaces, their batches and
outputs, and their restarts, held in memory and the same at every start.
Plain Python 3, standard library only.

Transport: one JSON-RPC 2.0 message per line on stdin and stdout (MCP's
stdio transport); diagnostics go to stderr, never to stdout, which belongs
to the protocol. Methods: initialize, notifications/initialized, ping,
tools/list, tools/call. Anything else gets a JSON-RPC error; a client that
first probes with a newer lifecycle method (server/discover) gets "method
not found" and falls back to initialize.

Run it by hand to see it work:

    printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' | python3 plant_server.py
"""

import copy
import datetime
import json
import re
import sys

SERVER_INFO = {"name": "plant", "title": "Foundry plant data", "version": "1.0.0"}

# Newest first; an initialize asking for one of these gets it echoed, any
# other gets the newest, and the client decides whether it can go on.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

FURNACE_ID = {
    "type": "string",
    "description": "Furnace id, e.g. F2",
    "pattern": "^F[0-9]+$",
}
BATCH_ID = {
    "type": "string",
    "description": "Batch id, e.g. B-1042",
    "pattern": "^B-[0-9]{4}$",
}


def read_only(title):
    return {
        "title": title,
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }


TOOLS = [
    {
        "name": "furnace_temperature",
        "title": "Furnace temperature",
        "description": "Current temperature, setpoint and status of one furnace.",
        "inputSchema": {
            "type": "object",
            "properties": {"furnace_id": FURNACE_ID},
            "required": ["furnace_id"],
            "additionalProperties": False,
        },
        "annotations": read_only("Furnace temperature"),
    },
    {
        "name": "list_batches",
        "title": "List batches",
        "description": "Batches cast in the plant, newest first; optionally only "
        "those of one furnace or in one status.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "furnace_id": FURNACE_ID,
                "status": {
                    "type": "string",
                    "enum": ["in_progress", "completed", "scrapped"],
                    "description": "Only batches in this status",
                },
            },
            "additionalProperties": False,
        },
        "annotations": read_only("List batches"),
    },
    {
        "name": "batch_output",
        "title": "Batch output",
        "description": "What one batch produced: good castings, scrap and weight.",
        "inputSchema": {
            "type": "object",
            "properties": {"batch_id": BATCH_ID},
            "required": ["batch_id"],
            "additionalProperties": False,
        },
        "annotations": read_only("Batch output"),
    },
    {
        "name": "restart_log",
        "title": "Restart log",
        "description": "Furnace restarts, oldest first; optionally of one furnace only.",
        "inputSchema": {
            "type": "object",
            "properties": {"furnace_id": FURNACE_ID},
            "additionalProperties": False,
        },
        "annotations": read_only("Restart log"),
    },
    {
        "name": "set_furnace_setpoint",
        "title": "Set furnace setpoint",
        "description": "Set the temperature a furnace holds, in degrees Celsius.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "furnace_id": FURNACE_ID,
                "temperature_c": {
                    "type": "number",
                    "minimum": 600,
                    "maximum": 1700,
                    "description": "New setpoint in degrees Celsius (600 to 1700)",
                },
            },
            "required": ["furnace_id", "temperature_c"],
            "additionalProperties": False,
        },
        # Changes plant state, but setting the same value twice changes
        # nothing more: a write, not a destructive action.
        "annotations": {
            "title": "Set furnace setpoint",
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
    },
    {
        "name": "restart_furnace",
        "title": "Restart furnace",
        "description": "Shut a furnace down and start it again. The batch in "
        "progress in it is scrapped.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "furnace_id": FURNACE_ID,
                "reason": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Why the furnace is restarted; kept in the restart log",
                },
            },
            "required": ["furnace_id", "reason"],
            "additionalProperties": False,
        },
        "annotations": {
            "title": "Restart furnace",
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": False,
        },
    },
]

INITIAL_PLANT = {
    "furnaces": {
        "F1": {"temperature_c": 1452.5, "setpoint_c": 1450, "status": "running"},
        "F2": {"temperature_c": 1538.0, "setpoint_c": 1540, "status": "running"},
        "F3": {"temperature_c": 41.0, "setpoint_c": 0, "status": "relining"},
        "F4": {"temperature_c": 1187.3, "setpoint_c": 1200, "status": "heating"},
    },
    # Newest first.
    "batches": [
        {"batch_id": "B-1046", "furnace_id": "F2", "alloy": "ductile iron",
         "status": "in_progress", "started_at": "2025-06-02T07:10:00Z",
         "castings": 0, "scrap": 0, "weight_kg": 0.0},
        {"batch_id": "B-1045", "furnace_id": "F1", "alloy": "grey iron",
         "status": "in_progress", "started_at": "2025-06-02T06:40:00Z",
         "castings": 0, "scrap": 0, "weight_kg": 0.0},
        {"batch_id": "B-1044", "furnace_id": "F4", "alloy": "steel 1.0619",
         "status": "scrapped", "started_at": "2025-06-01T22:05:00Z",
         "castings": 0, "scrap": 38, "weight_kg": 0.0},
        {"batch_id": "B-1043", "furnace_id": "F2", "alloy": "ductile iron",
         "status": "completed", "started_at": "2025-06-01T18:30:00Z",
         "castings": 412, "scrap": 9, "weight_kg": 5150.0},
        {"batch_id": "B-1042", "furnace_id": "F1", "alloy": "grey iron",
         "status": "completed", "started_at": "2025-06-01T14:00:00Z",
         "castings": 388, "scrap": 14, "weight_kg": 4462.0},
    ],
    # Oldest first.
    "restarts": [
        {"furnace_id": "F4", "at": "2025-06-01T23:50:00Z",
         "reason": "thermocouple fault after B-1044", "by": "night shift"},
    ],
}

# The plant's own clock: state changes get consecutive minutes from here,
# so a session's results are the same on every run.
CLOCK_START = datetime.datetime(2025, 6, 2, 8, 0, tzinfo=datetime.timezone.utc)


class ToolError(Exception):
    """A tool that cannot do what was asked: reported to the model as a
    tool result with isError, not as a protocol error."""


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class Plant:
    def __init__(self):
        self.data = copy.deepcopy(INITIAL_PLANT)
        self.changes = 0

    def now(self):
        self.changes += 1
        at = CLOCK_START + datetime.timedelta(minutes=self.changes)
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")

    def furnace(self, furnace_id):
        furnace = self.data["furnaces"].get(furnace_id)
        if furnace is None:
            known = ", ".join(sorted(self.data["furnaces"]))
            raise ToolError("unknown furnace %s (known: %s)" % (furnace_id, known))
        return furnace

    def furnace_temperature(self, args):
        furnace = self.furnace(args["furnace_id"])
        return dict({"furnace_id": args["furnace_id"]}, **furnace)

    def list_batches(self, args):
        if "furnace_id" in args:
            self.furnace(args["furnace_id"])
        batches = [
            {k: b[k] for k in ("batch_id", "furnace_id", "alloy", "status", "started_at")}
            for b in self.data["batches"]
            if args.get("furnace_id", b["furnace_id"]) == b["furnace_id"]
            and args.get("status", b["status"]) == b["status"]
        ]
        return {"batches": batches}

    def batch_output(self, args):
        for batch in self.data["batches"]:
            if batch["batch_id"] == args["batch_id"]:
                return dict(batch)
        raise ToolError("unknown batch %s" % args["batch_id"])

    def restart_log(self, args):
        if "furnace_id" in args:
            self.furnace(args["furnace_id"])
        restarts = [
            dict(r)
            for r in self.data["restarts"]
            if args.get("furnace_id", r["furnace_id"]) == r["furnace_id"]
        ]
        return {"restarts": restarts}

    def set_furnace_setpoint(self, args):
        furnace = self.furnace(args["furnace_id"])
        if furnace["status"] == "relining":
            raise ToolError("%s is being relined and cannot be heated" % args["furnace_id"])
        previous = furnace["setpoint_c"]
        furnace["setpoint_c"] = args["temperature_c"]
        return {
            "furnace_id": args["furnace_id"],
            "previous_setpoint_c": previous,
            "setpoint_c": args["temperature_c"],
            "at": self.now(),
        }

    def restart_furnace(self, args):
        furnace_id = args["furnace_id"]
        furnace = self.furnace(furnace_id)
        if furnace["status"] == "relining":
            raise ToolError("%s is being relined and cannot be restarted" % furnace_id)
        scrapped = []
        for batch in self.data["batches"]:
            if batch["furnace_id"] == furnace_id and batch["status"] == "in_progress":
                batch["status"] = "scrapped"
                scrapped.append(batch["batch_id"])
        furnace["status"] = "heating"
        entry = {"furnace_id": furnace_id, "at": self.now(),
                 "reason": args["reason"], "by": "keel"}
        self.data["restarts"].append(entry)
        return {"restarted": furnace_id, "status": "heating",
                "scrapped_batches": scrapped, "at": entry["at"]}


def schema_errors(schema, value):
    """The ways `value` breaks the subset of JSON Schema this server's tools
    use; an empty list when it is valid."""
    errors = []
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            errors.append("missing required argument %r" % name)
    for name, item in value.items():
        spec = properties.get(name)
        if spec is None:
            if schema.get("additionalProperties") is False:
                errors.append("unknown argument %r" % name)
            continue
        kind = spec.get("type")
        if kind == "string":
            if not isinstance(item, str):
                errors.append("%s must be a string" % name)
                continue
            if "enum" in spec and item not in spec["enum"]:
                errors.append("%s must be one of %s" % (name, ", ".join(spec["enum"])))
            if "pattern" in spec and not re.search(spec["pattern"], item):
                errors.append("%s %r does not look like %s" % (
                    name, item, spec.get("description", spec["pattern"])))
            if len(item) < spec.get("minLength", 0):
                errors.append("%s must not be empty" % name)
        elif kind == "number":
            # bool is an int in Python, but true is no temperature.
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                errors.append("%s must be a number" % name)
                continue
            if item < spec.get("minimum", item) or item > spec.get("maximum", item):
                errors.append("%s must be between %s and %s" % (
                    name, spec["minimum"], spec["maximum"]))
    return errors


class Server:
    def __init__(self):
        self.plant = Plant()
        self.tools = {tool["name"]: tool for tool in TOOLS}

    def handle(self, message):
        """The response to one message, or None for a notification."""
        if not isinstance(message, dict):
            return error_response(None, INVALID_REQUEST,
                                  "a message must be a JSON object (batches are not supported)")
        msg_id = message.get("id")
        is_request = "id" in message
        if "method" not in message:
            # A response to a request this server never sends: nothing to do.
            if "result" in message or "error" in message:
                return None
            return error_response(msg_id, INVALID_REQUEST, "no method")
        method = message["method"]
        if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return error_response(msg_id if is_request else None, INVALID_REQUEST,
                                  'expected {"jsonrpc": "2.0", "method": <string>, ...}')
        if is_request and (isinstance(msg_id, bool) or not isinstance(msg_id, (str, int))):
            return error_response(None, INVALID_REQUEST, "id must be a string or an integer")
        params = message.get("params", {})
        if not is_request:
            # Notifications (initialized, cancelled, ...) need no answer,
            # and this server has nothing to do for any of them.
            return None
        try:
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            return {"jsonrpc": "2.0", "id": msg_id, "result": self.dispatch(method, params)}
        except RpcError as e:
            return error_response(msg_id, e.code, e.message)
        except Exception as e:  # a bug here must not take the server down
            log("internal error in %s: %r" % (method, e))
            return error_response(msg_id, INTERNAL_ERROR, "internal error: %s" % e)

    def dispatch(self, method, params):
        if method == "initialize":
            return self.initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            return self.call(params)
        raise RpcError(METHOD_NOT_FOUND, "method not found: %s" % method)

    def initialize(self, params):
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "initialize needs protocolVersion (a string)")
        version = requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
            "instructions": "Read-only tools report furnaces, batches and restarts. "
            "set_furnace_setpoint changes a furnace's setpoint; restart_furnace "
            "scraps the batch in progress.",
        }

    def call(self, params):
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call needs name (a string)")
        tool = self.tools.get(name)
        if tool is None:
            raise RpcError(INVALID_PARAMS, "unknown tool: %s (tools: %s)" % (
                name, ", ".join(self.tools)))
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be an object")
        # Invalid arguments are a tool error, not a protocol error, so the
        # model reads what was wrong and can correct the call.
        errors = schema_errors(tool["inputSchema"], arguments)
        if errors:
            return tool_result("invalid arguments: " + "; ".join(errors), is_error=True)
        try:
            result = getattr(self.plant, name)(arguments)
        except ToolError as e:
            return tool_result(str(e), is_error=True)
        return tool_result(json.dumps(result, ensure_ascii=False))


def tool_result(text, is_error=False):
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def error_response(msg_id, code, message):
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def log(text):
    print("plant_server: %s" % text, file=sys.stderr, flush=True)


def reject_constant(name):
    # Python's json reads NaN and Infinity, which are not JSON and would
    # slip through every numeric bound.
    raise ValueError("%s is not a JSON value" % name)


def serve(stdin, stdout):
    server = Server()
    for raw in stdin:
        line = raw.strip()
        if not line:
            continue
        try:
            message = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
        except (ValueError, RecursionError) as e:
            # UnicodeDecodeError and JSONDecodeError are ValueErrors; absurd
            # nesting exhausts the parser's recursion instead.
            response = error_response(None, PARSE_ERROR, "parse error: %s" % e)
        else:
            response = server.handle(message)
        if response is not None:
            stdout.write(json.dumps(response, ensure_ascii=False).encode("utf-8") + b"\n")
            stdout.flush()


def main():
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
