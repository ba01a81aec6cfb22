// pi-dispatch's MCP extension for pi, written by the runner into pi's private agent folder.
//
// It runs pi's own MCP extension (builtin:mcp is switched off in settings.json and this file loads
// it instead) with three differences:
// - servers other extensions register with pi.registerMcpServer() are never seen, so never
//   connected: only the hub endpoints in mcp.json connect;
// - there is no /mcp command;
// - the names only the job's MCP may own (codemode, tool_search, the resource tools, mcp__*, /mcp)
//   are checked: taken by another extension as pi loads, the job ends before its prompt
//   (mcp-shadowed); taken later, every call to them is refused.
// When the overlay turns codemode's models off, codemode is registered here without them.
// pi's own listing counts: before the prompt, every server of the job must have had its tools
// registered by pi's MCP extension (as many as the hub serves, in listed.json); a server pi's
// MCP extension reports as failed ends the job (mcp-unavailable), and one whose tools pi has not
// registered when the wait runs out ends it too (mcp-unreachable). pi may start while the servers
// still connect: the runner writes listed.json once they are (and ends pi if they are not), so the
// prompt waits for it.
//
// The runner fills in the constants below.
import { createMcpExtension } from __MCP_MODULE__;
import { createCodemodeExtension } from __CODEMODE_MODULE__;

const SELF = __SELF_PATH__;
const REPORT = __REPORT_PATH__;
const EXPECTED = __EXPECTED_PATH__;
const CODEMODE_MODELS = __CODEMODE_MODELS__;

import { writeFileSync, renameSync, readFileSync } from "node:fs";

const RESOURCE_TOOLS = new Set(["list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource"]);

/** Whether only the job's MCP may own this tool name. */
function reserved(name) {
  return name === "codemode" || name === "tool_search" || RESOURCE_TOOLS.has(name) || name.startsWith("mcp__");
}

/** Whether the tool comes from where it should: pi's own codemode and tool_search, or this file. */
function owned(tool) {
  const path = tool.sourceInfo?.path;
  if (path === SELF) return true;
  if (tool.name === "codemode") return CODEMODE_MODELS && path === "builtin:codemode";
  if (tool.name === "tool_search") return path === "builtin:tool-search";
  return false;
}

function report(reason, name) {
  // Written whole, then renamed: the runner reads either nothing or all of it.
  writeFileSync(REPORT + ".tmp", JSON.stringify({ reason, name }) + "\n", { mode: 0o600 });
  renameSync(REPORT + ".tmp", REPORT);
}

/** Ends pi before (or instead of) its prompt; the runner reads the report. */
function stop(reason, name, why) {
  report(reason, name);
  process.stderr.write(`pi-dispatch: ${why}\n`);
  process.exit(70);
}

/** The servers the hub serves and how many tools each lists, and how long to wait for pi; undefined
 * until the runner has written it. */
function expected() {
  try {
    return JSON.parse(readFileSync(EXPECTED, "utf8"));
  } catch {
    return undefined;
  }
}

/** The tools pi's MCP extension registered, by server (a tool's label is `server/tool`). */
const listed = new Map();
function noteTool(definition) {
  const label = definition?.label;
  if (typeof label !== "string" || !label.includes("/")) return;
  const server = label.slice(0, label.indexOf("/"));
  if (!listed.has(server)) listed.set(server, new Set());
  listed.get(server).add(label);
}

/** A notice of pi's MCP extension that a server failed ends the job, naming the server. */
function refused(message) {
  if (typeof message !== "string") return;
  if (message.startsWith("MCP failed to load:")) stop("mcp-unavailable", "", "pi's MCP did not load");
  if (!message.startsWith("MCP servers need attention:")) return;
  // Before listed.json, every server pi's MCP names is the job's: it connects no other.
  const servers = expected()?.servers;
  for (const line of message.split("\n").slice(1)) {
    if (!line.startsWith("  ") || !line.includes(":")) continue;
    const name = line.slice(2, line.indexOf(":"));
    if (servers === undefined || Object.hasOwn(servers, name)) stop("mcp-unavailable", name, `pi refused the MCP server ${name}`);
  }
}

/** `ctx`, with `ui.notify` watched for those notices. */
function watched(ctx) {
  if (!ctx || typeof ctx !== "object" || !ctx.ui) return ctx;
  const bound = (t, p) => {
    const v = Reflect.get(t, p, t);
    return typeof v === "function" ? v.bind(t) : v;
  };
  const ui = new Proxy(ctx.ui, {
    get(t, p) {
      if (p === "notify") return (message, ...rest) => { refused(message); return t.notify(message, ...rest); };
      return bound(t, p);
    },
  });
  return new Proxy(ctx, { get: (t, p) => (p === "ui" ? ui : bound(t, p)) });
}

/** Waits until pi registered every tool the hub serves of every server, or the wait runs out. */
async function waitForListing() {
  let known = expected();
  while (known === undefined) {
    await new Promise((resolve) => setTimeout(resolve, 5));
    known = expected();
  }
  // The deadline is the job's one wait, begun when the runner started connecting.
  const { deadlineMs, servers } = known;
  const deadline = deadlineMs || 0;
  for (;;) {
    const missing = Object.entries(servers).find(([name, count]) => (listed.get(name)?.size ?? 0) < count);
    if (!missing) return;
    if (Date.now() >= deadline) {
      stop("mcp-unreachable", missing[0], `pi had not listed the tools of ${missing[0]} when the wait ran out`);
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

export default function (pi) {
  // A pi the job starts itself is given --no-mcp (the runner's `pi` on PATH): it connects nothing.
  if (process.argv.includes("--no-mcp")) return;
  const guarded = new Proxy(pi, {
    get(target, prop) {
      if (prop === "getMcpServers") return () => [];
      if (prop === "registerTool") {
        return (definition) => {
          noteTool(definition);
          return target.registerTool(definition);
        };
      }
      if (prop === "on") return (event, handler) => target.on(event, (e, ctx) => handler(e, watched(ctx)));
      if (prop === "registerCommand") {
        return (name, options) => {
          if (name !== "mcp") target.registerCommand(name, options);
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  // As pi loads (session start) and once more just before the prompt goes out (after every
  // extension's own session-start handlers): a reserved name taken ends the job.
  const check = () => {
    const tool = pi.getAllTools().find((t) => reserved(t.name) && !owned(t));
    const command = pi.getCommands().find((c) => c.name === "mcp" || c.name.startsWith("mcp:"));
    const name = tool ? tool.name : command ? "/mcp" : undefined;
    if (name !== undefined) stop("mcp-shadowed", name, `an extension registers ${name}, which only the job's MCP may`);
  };
  // With codemode's models off, this file's codemode stands in for pi's, registered only once
  // every extension has loaded (and before pi's MCP activates it at session start): pi keeps the
  // first tool of a name and will not load an extension whose tool another already has, so an
  // extension taking `codemode` as it loads is then the one found here, and ends the job.
  pi.on("session_start", async () => {
    check();
    if (!CODEMODE_MODELS) createCodemodeExtension({ models: false })(pi);
  });
  createMcpExtension()(guarded);
  pi.on("before_agent_start", async () => {
    check();
    await waitForListing();
  });

  pi.on("tool_call", async (event) => {
    if (!reserved(event.toolName)) return undefined;
    const tool = pi.getAllTools().find((t) => t.name === event.toolName);
    if (tool && owned(tool)) return undefined;
    return { block: true, reason: `${event.toolName} is reserved for the job's MCP servers; this call was refused` };
  });
}
