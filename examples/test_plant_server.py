"""Tests of plant_server.py, run as a subprocess speaking MCP over stdio.

    python3 -m unittest examples/test_plant_server.py
"""

import json
import os
import subprocess
import sys
import unittest

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plant_server.py")

READS = ["furnace_temperature", "list_batches", "batch_output", "restart_log"]


class PlantServerTest(unittest.TestCase):
    def setUp(self):
        self.proc = subprocess.Popen(
            [sys.executable, SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0

    def tearDown(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        # End of input ends the server cleanly, whatever it was sent.
        self.assertEqual(self.proc.returncode, 0)

    def send_line(self, line):
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def receive(self):
        line = self.proc.stdout.readline()
        self.assertTrue(line, "the server closed its output")
        self.assertTrue(line.endswith(b"\n"))
        return json.loads(line)

    def request(self, method, params=None):
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send_line(json.dumps(message))
        response = self.receive()
        self.assertEqual(response["jsonrpc"], "2.0")
        self.assertEqual(response["id"], self.next_id)
        return response

    def initialize(self, version="2025-11-25"):
        response = self.request("initialize", {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        })
        self.send_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        return response["result"]

    def call(self, name, arguments):
        response = self.request("tools/call", {"name": name, "arguments": arguments})
        self.assertNotIn("error", response)
        result = response["result"]
        self.assertEqual(len(result["content"]), 1)
        self.assertEqual(result["content"][0]["type"], "text")
        return result

    def call_ok(self, name, arguments):
        result = self.call(name, arguments)
        self.assertFalse(result["isError"], result)
        return json.loads(result["content"][0]["text"])

    def test_initialize_answers_with_the_clients_version_or_its_own(self):
        result = self.initialize("2025-11-25")
        self.assertEqual(result["protocolVersion"], "2025-11-25")
        self.assertEqual(result["serverInfo"]["name"], "plant")
        self.assertIn("tools", result["capabilities"])
        older = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        self.assertEqual(older["result"]["protocolVersion"], "2025-06-18")
        unknown = self.request("initialize", {"protocolVersion": "1999-01-01", "capabilities": {}})
        self.assertEqual(unknown["result"]["protocolVersion"], "2025-11-25")

    def test_notifications_get_no_answer_and_ping_does(self):
        self.initialize()
        # Had the notification been answered, that answer would come first.
        self.assertEqual(self.request("ping")["result"], {})

    def test_tools_list_names_and_annotations(self):
        self.initialize()
        tools = {t["name"]: t for t in self.request("tools/list")["result"]["tools"]}
        self.assertEqual(
            sorted(tools),
            sorted(READS + ["set_furnace_setpoint", "restart_furnace"]),
        )
        for name in READS:
            self.assertIs(tools[name]["annotations"]["readOnlyHint"], True, name)
            self.assertIs(tools[name]["annotations"]["destructiveHint"], False, name)
        restart = tools["restart_furnace"]["annotations"]
        self.assertIs(restart["readOnlyHint"], False)
        self.assertIs(restart["destructiveHint"], True)
        setpoint = tools["set_furnace_setpoint"]["annotations"]
        self.assertIs(setpoint["readOnlyHint"], False)
        self.assertIs(setpoint["destructiveHint"], False)
        for tool in tools.values():
            self.assertEqual(tool["inputSchema"]["type"], "object")
            self.assertTrue(tool["description"])

    def test_each_tool_can_be_called(self):
        self.initialize()
        f2 = self.call_ok("furnace_temperature", {"furnace_id": "F2"})
        self.assertEqual((f2["furnace_id"], f2["temperature_c"], f2["status"]),
                         ("F2", 1538.0, "running"))

        batches = self.call_ok("list_batches", {})["batches"]
        self.assertEqual([b["batch_id"] for b in batches][:2], ["B-1046", "B-1045"])
        done = self.call_ok("list_batches", {"furnace_id": "F1", "status": "completed"})
        self.assertEqual([b["batch_id"] for b in done["batches"]], ["B-1042"])

        output = self.call_ok("batch_output", {"batch_id": "B-1043"})
        self.assertEqual((output["castings"], output["scrap"], output["weight_kg"]),
                         (412, 9, 5150.0))

        self.assertEqual(len(self.call_ok("restart_log", {})["restarts"]), 1)

        setpoint = self.call_ok("set_furnace_setpoint", {"furnace_id": "F1", "temperature_c": 1480})
        self.assertEqual((setpoint["previous_setpoint_c"], setpoint["setpoint_c"]), (1450, 1480))
        self.assertEqual(self.call_ok("furnace_temperature", {"furnace_id": "F1"})["setpoint_c"], 1480)

        restart = self.call_ok("restart_furnace", {"furnace_id": "F2", "reason": "burner fault"})
        self.assertEqual(restart["scrapped_batches"], ["B-1046"])
        log = self.call_ok("restart_log", {"furnace_id": "F2"})["restarts"]
        self.assertEqual([(r["furnace_id"], r["reason"]) for r in log], [("F2", "burner fault")])
        self.assertEqual(self.call_ok("batch_output", {"batch_id": "B-1046"})["status"], "scrapped")

    def test_tool_errors_are_results_with_is_error(self):
        self.initialize()
        cases = [
            ("furnace_temperature", {"furnace_id": "F9"}, "unknown furnace F9"),
            ("batch_output", {"batch_id": "B-0001"}, "unknown batch B-0001"),
            ("restart_furnace", {"furnace_id": "F3", "reason": "x"}, "being relined"),
            ("furnace_temperature", {}, "missing required argument 'furnace_id'"),
            ("furnace_temperature", {"furnace_id": "furnace two"}, "does not look like"),
            ("set_furnace_setpoint", {"furnace_id": "F1", "temperature_c": 5000}, "between 600 and 1700"),
            ("set_furnace_setpoint", {"furnace_id": "F1", "temperature_c": "hot"}, "must be a number"),
            ("list_batches", {"colour": "red"}, "unknown argument 'colour'"),
        ]
        for name, arguments, expected in cases:
            result = self.call(name, arguments)
            self.assertTrue(result["isError"], (name, arguments))
            self.assertIn(expected, result["content"][0]["text"])

    def test_protocol_errors(self):
        self.initialize()
        unknown_tool = self.request("tools/call", {"name": "melt_everything", "arguments": {}})
        self.assertEqual(unknown_tool["error"]["code"], -32602)
        self.assertIn("melt_everything", unknown_tool["error"]["message"])
        no_name = self.request("tools/call", {"arguments": {}})
        self.assertEqual(no_name["error"]["code"], -32602)
        bad_arguments = self.request("tools/call", {"name": "restart_log", "arguments": [1]})
        self.assertEqual(bad_arguments["error"]["code"], -32602)
        unknown_method = self.request("resources/list")
        self.assertEqual(unknown_method["error"]["code"], -32601)
        no_version = self.request("initialize", {})
        self.assertEqual(no_version["error"]["code"], -32602)

    def test_malformed_lines_get_errors_and_the_server_goes_on(self):
        self.initialize()
        for line, code in [
            ("this is not json", -32700),
            ('{"jsonrpc": "2.0", "id": 1, "method": ', -32700),
            ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":NaN}}}', -32700),
            ("[" * 100000, -32700),
            ("[]", -32600),
            ("42", -32600),
            ('{"jsonrpc": "1.0", "id": 7, "method": "ping"}', -32600),
            ('{"jsonrpc": "2.0", "id": 7, "method": 12}', -32600),
            ('{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": [1]}', -32602),
        ]:
            self.send_line(line)
            response = self.receive()
            self.assertEqual(response["error"]["code"], code, line[:60])
            self.assertTrue(response["error"]["message"])
        self.proc.stdin.write(b"\xff\xfe not utf-8\n")
        self.proc.stdin.flush()
        self.assertEqual(self.receive()["error"]["code"], -32700)
        # Still serving.
        self.assertEqual(self.request("ping")["result"], {})


if __name__ == "__main__":
    unittest.main()
