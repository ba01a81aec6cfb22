// A process of the job tries to open a session on the hub: with what pi's mcp.json names (its
// references expanded from this process's own environment: over HTTP its header, through the relay
// the relay itself, run as pi would run it) and with every token-like string it can find, on the
// hub's socket directly too.
import fs from "node:fs";
import net from "node:net";
import { spawn } from "node:child_process";
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
/** The first line a stream answers after `first` (or what ended it). */
function firstLine(start, first) {
  return new Promise((resolve) => {
    let text = "";
    const done = (what) => { clearTimeout(timer); resolve(what); };
    const timer = setTimeout(() => done("timeout"), 5000);
    const { input, output, end } = start();
    output.on("data", (d) => { text += d; if (text.includes("\n")) { end(); done(text.split("\n")[0]); } });
    output.on("error", (e) => done(`error ${e.code}`));
    output.on("close", () => done(text.split("\n")[0] || "closed"));
    input.on("error", () => {});
    input.write(first);
  });
}
const opened = (line) => { try { return JSON.parse(line).result !== undefined; } catch { return false; } };
const message = `${JSON.stringify(init)}\n`;
for (const [name, server] of Object.entries(config.mcpServers)) {
  const outcomes = new Set();
  let tries = 0;
  const note = (line) => {
    tries += 1;
    if (opened(line)) console.log(`HUB-SESSION-OPENED ${name}`);
    outcomes.add(opened(line) ? "opened" : line.slice(0, 160));
  };
  if (server.url) {
    for (const auth of [expand(server.headers?.Authorization ?? "")].concat([...tokens].map((t) => `Bearer ${t}`))) {
      const r = await fetch(server.url, { method: "POST", body: JSON.stringify(init),
        headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: auth } });
      note(r.ok ? '{"result":{}}' : `HTTP ${r.status}`);
    }
  }
  if (server.command) {
    // The relay as pi runs it, with this process's environment and with each token found.
    for (const token of [undefined, ...tokens]) {
      const env = { ...process.env };
      if (token !== undefined) env.PI_DISPATCH_HUB_TOKEN = token;
      note(await firstLine(() => {
        const child = spawn(server.command, server.args, { env, stdio: ["pipe", "pipe", "ignore"] });
        return { input: child.stdin, output: child.stdout, end: () => child.kill() };
      }, message));
    }
    // The hub's socket itself.
    const socket = server.args[server.args.indexOf("--socket") + 1];
    for (const token of tokens) {
      note(await firstLine(() => {
        const c = net.createConnection(socket);
        return { input: c, output: c, end: () => c.destroy() };
      }, `${name} Bearer ${token}\n${message}`));
    }
  }
  console.log(`hub ${name}: ${tries} tries, outcomes ${[...outcomes].join(" | ")}`);
}
