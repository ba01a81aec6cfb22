// A stdio MCP server whose words a file decides, for the pin tests and the pins benchmark. At its
// start (each connect) it reads the file named by its first argument: `{"serverInfo": {...},
// "tools": [...]}` answers every connect alike; `{"connects": [A, B, ...]}` answers the Nth
// connect with the Nth (the last again after the end), counted in `<file>.count`, so that a
// server can say one thing to one client and another to the next. Tools are sent byte for byte
// as the file has them (raw JSON-RPC, no SDK to tidy them), and a call of any listed tool answers
// `called NAME` with its arguments.
import fs from "node:fs";
import readline from "node:readline";

const file = process.argv[2];
const countFile = `${file}.count`;
// Read once, at the connect: a server process serves one client.
const all = JSON.parse(fs.readFileSync(file, "utf8"));
// Connects are counted only for a file of several answers: a file of one leaves nothing behind.
let connect = 0;
if (Array.isArray(all.connects)) {
  try { connect = Number(fs.readFileSync(countFile, "utf8")) || 0; } catch {}
  try { fs.writeFileSync(countFile, String(connect + 1)); } catch {}
}
const said = Array.isArray(all.connects)
  ? all.connects[Math.min(connect, all.connects.length - 1)]
  : all;
const send = (message) => process.stdout.write(`${JSON.stringify(message)}\n`);
// The tools as raw text, so that key order, spacing and duplicate keys reach the client as written.
const rawTools = said.rawTools ?? JSON.stringify(said.tools);
const listed = new Set((said.tools ?? []).map((t) => t.name));

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let request;
  try { request = JSON.parse(line); } catch { return; }
  const { id, method, params } = request;
  if (id === undefined) return;
  if (method === "initialize") {
    send({ jsonrpc: "2.0", id, result: {
      protocolVersion: params?.protocolVersion ?? "2025-06-18",
      capabilities: { tools: { listChanged: false } },
      serverInfo: said.serverInfo ?? { name: "listed", version: "1.0.0" },
    } });
  } else if (method === "tools/list") {
    process.stdout.write(`{"jsonrpc":"2.0","id":${JSON.stringify(id)},"result":{"tools":${rawTools}}}\n`);
  } else if (method === "tools/call") {
    const name = params?.name;
    send(listed.has(name)
      ? { jsonrpc: "2.0", id, result: { content: [{ type: "text", text: `called ${name} ${JSON.stringify(params.arguments ?? {})}` }] } }
      : { jsonrpc: "2.0", id, error: { code: -32602, message: `unknown tool ${name}` } });
  } else if (method === "ping") {
    send({ jsonrpc: "2.0", id, result: {} });
  } else {
    send({ jsonrpc: "2.0", id, error: { code: -32601, message: "method not found" } });
  }
});
