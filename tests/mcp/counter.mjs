#!/usr/bin/env node
// A tiny stdio MCP server for the concurrency, timeout and cancellation tests
// of tests/it/mcp.rs (the other tests use the real third-party servers).
//
// Tools:
// - work {n}: counts itself in flight for ~20 ms and answers
//   {"n": n, "maxInFlight": m}, m the most calls in flight seen so far;
// - hang: never answers (until the client cancels it);
// - fail: a tool error (isError: true) with the text "failed on purpose";
// - throw: a JSON-RPC error (the handler throws "thrown on purpose");
// - stats: {"hanging": h, "cancelled": k}: hang calls waiting now, and those
//   cancelled by the client (notifications/cancelled) so far;
// - grow: adds a tool `extra` (answers "extra") and sends
//   notifications/tools/list_changed;
// - die: the process exits (code 7) in the middle of the call.
//
// It keeps running after its stdin closes (set COUNTER_STUBBORN=0 to let it
// exit then). With COUNTER_PID_FILE set, the process appends its pid to that file when
// it starts (so tests can check that no server outlives them), and the line
// "hanging" when a hang call has arrived.
import { appendFileSync } from "node:fs";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CallToolRequestSchema,
  ListToolsRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

const tools = [
  {
    name: "work",
    description: "Counts itself in flight for about 20 ms.",
    inputSchema: {
      type: "object",
      properties: { n: { type: "integer" } },
      required: ["n"],
    },
  },
  {
    name: "hang",
    description: "Never answers.",
    inputSchema: { type: "object", properties: {} },
  },
  {
    name: "fail",
    description: "Always fails.",
    inputSchema: { type: "object", properties: {} },
  },
  {
    name: "throw",
    description: "Answers with a JSON-RPC error.",
    inputSchema: { type: "object", properties: {} },
  },
  {
    name: "stats",
    description:
      "How many hang calls are waiting, and were cancelled; with cancelled_at_least, once that many were (or after 10 s).",
    inputSchema: {
      type: "object",
      properties: { cancelled_at_least: { type: "integer" } },
    },
  },
  {
    name: "die",
    description: "Exits the server mid-call.",
    inputSchema: { type: "object", properties: {} },
  },
  {
    name: "grow",
    description: "Adds the tool extra.",
    inputSchema: { type: "object", properties: {} },
  },
];

let inFlight = 0;
let maxInFlight = 0;
let cancelled = 0;
let hanging = 0;
// Stats calls waiting for `cancelled` to reach a count: a client's
// notifications/cancelled is sent on its own, so a request that follows it
// may arrive first.
let waiters = [];
const cancelledOnce = () => {
  const ready = waiters.filter((w) => cancelled >= w.count);
  waiters = waiters.filter((w) => cancelled < w.count);
  ready.forEach((w) => w.resolve());
};

const text = (value) => ({
  content: [{ type: "text", text: JSON.stringify(value) }],
});

const server = new Server(
  { name: "counter", version: "1.0.0" },
  { capabilities: { tools: { listChanged: true } } },
);

server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));

server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
  const { name, arguments: args = {} } = request.params;
  switch (name) {
    case "work": {
      inFlight += 1;
      maxInFlight = Math.max(maxInFlight, inFlight);
      await new Promise((resolve) => setTimeout(resolve, 20));
      inFlight -= 1;
      return text({ n: args.n, maxInFlight });
    }
    case "hang":
      hanging += 1;
      if (process.env.COUNTER_PID_FILE) {
        appendFileSync(process.env.COUNTER_PID_FILE, "hanging\n");
      }
      return new Promise(() => {
        extra.signal.addEventListener("abort", () => {
          hanging -= 1;
          cancelled += 1;
          cancelledOnce();
        });
      });
    case "fail":
      return {
        content: [{ type: "text", text: "failed on purpose" }],
        isError: true,
      };
    case "throw":
      throw new Error("thrown on purpose");
    case "stats":
      if (args.cancelled_at_least > cancelled) {
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, 10000);
          waiters.push({
            count: args.cancelled_at_least,
            resolve: () => {
              clearTimeout(timer);
              resolve();
            },
          });
        });
      }
      return text({ hanging, cancelled });
    case "grow":
      if (!tools.some((tool) => tool.name === "extra")) {
        tools.push({
          name: "extra",
          description: "Added by grow.",
          inputSchema: { type: "object", properties: {} },
        });
      }
      await server.sendToolListChanged();
      return text("grown");
    case "extra":
      return text("extra");
    case "die":
      process.exit(7);
    default:
      throw new Error(`unknown tool ${name}`);
  }
});

if (process.env.COUNTER_PID_FILE) {
  appendFileSync(process.env.COUNTER_PID_FILE, `${process.pid}\n`);
}

await server.connect(new StdioServerTransport());

// Like many real servers, this one does not exit when its stdin closes: only
// a kill ends it (so the tests that no server outlives arbor mean something).
if (process.env.COUNTER_STUBBORN !== "0") {
  setInterval(() => {}, 1 << 30);
}
