// pi-dispatch: the job's usage meter, loaded by every Node.js program a stdio MCP server starts
// (NODE_OPTIONS=--require). In anything but pi it does nothing. In a pi it points pi at the job's
// model gateway before pi reads anything: the agent folder the runner keeps for such a pi
// (PI_DISPATCH_CHILD_LEDGER, whose models.json routes every provider through the gateway), the
// stand-in for the provider's key, and --no-mcp (a pi the job starts connects no MCP server).
"use strict";
try {
  const fs = require("node:fs");
  const path = require("node:path");
  const ledger = process.env.PI_DISPATCH_CHILD_LEDGER;
  const main = ledger && process.argv[1] ? fs.realpathSync(process.argv[1]) : "";
  if (main) {
    const meter = JSON.parse(fs.readFileSync(path.join(ledger, "meter.json"), "utf8"));
    const dist = path.join(meter.package, "dist") + path.sep;
    if (main.startsWith(dist) && path.basename(main) === "cli.js") {
      process.env.PI_CODING_AGENT_DIR = ledger;
      process.env.PI_OFFLINE = "1";
      process.env.PI_SKIP_VERSION_CHECK = "1";
      if (meter.variable) process.env[meter.variable] = meter.standIn;
      if (!process.argv.includes("--no-mcp")) process.argv.splice(2, 0, "--no-mcp");
    }
  }
} catch {
  // No meter file (the job has no gateway) or an unreadable one: the program runs as it is.
}
