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
//
// The runner fills in the four constants below.
import { createMcpExtension } from __MCP_MODULE__;
import { createCodemodeExtension } from __CODEMODE_MODULE__;

const SELF = __SELF_PATH__;
const REPORT = __REPORT_PATH__;
const CODEMODE_MODELS = __CODEMODE_MODELS__;

import { writeFileSync, renameSync } from "node:fs";

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

function report(name) {
  // Written whole, then renamed: the runner reads either nothing or all of it.
  writeFileSync(REPORT + ".tmp", JSON.stringify({ reason: "mcp-shadowed", name }) + "\n", { mode: 0o600 });
  renameSync(REPORT + ".tmp", REPORT);
}

export default function (pi) {
  // A pi the job starts itself is given --no-mcp (the runner's `pi` on PATH): it connects nothing.
  if (process.argv.includes("--no-mcp")) return;
  const guarded = new Proxy(pi, {
    get(target, prop) {
      if (prop === "getMcpServers") return () => [];
      if (prop === "registerCommand") {
        return (name, options) => {
          if (name !== "mcp") target.registerCommand(name, options);
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  createMcpExtension()(guarded);
  if (!CODEMODE_MODELS) createCodemodeExtension({ models: false })(pi);

  // As pi loads (session start) and once more just before the prompt goes out (after every
  // extension's own session-start handlers): a reserved name taken ends the job.
  const check = () => {
    const tool = pi.getAllTools().find((t) => reserved(t.name) && !owned(t));
    const command = pi.getCommands().find((c) => c.name === "mcp" || c.name.startsWith("mcp:"));
    const name = tool ? tool.name : command ? "/mcp" : undefined;
    if (name !== undefined) {
      report(name);
      process.stderr.write(`pi-dispatch: an extension registers ${name}, which only the job's MCP may\n`);
      process.exit(70);
    }
  };
  pi.on("session_start", async () => check());
  pi.on("before_agent_start", async () => check());

  pi.on("tool_call", async (event) => {
    if (!reserved(event.toolName)) return undefined;
    const tool = pi.getAllTools().find((t) => t.name === event.toolName);
    if (tool && owned(tool)) return undefined;
    return { block: true, reason: `${event.toolName} is reserved for the job's MCP servers; this call was refused` };
  });
}
