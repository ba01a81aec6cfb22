// pi-dispatch: the job's usage meter, an ES module every Node.js program a stdio MCP server starts
// imports first (NODE_OPTIONS=--import, as a data: URL, so that it needs no file a server may not
// see). In anything but pi it does nothing. In a pi it points pi at the job's model gateway before
// pi reads anything: the agent folder PI_DISPATCH_CHILD_LEDGER names (made here, with the
// gateway's models.json, when the server's own /tmp does not have it), the stand-in for the
// provider's key, and --no-mcp (a pi the job starts connects no MCP server).
import fs from "node:fs";
import path from "node:path";

const METER = __METER__;

try {
  const ledger = process.env.PI_DISPATCH_CHILD_LEDGER;
  const main = ledger && process.argv[1] ? fs.realpathSync(process.argv[1]) : "";
  const dist = path.join(METER.package, "dist") + path.sep;
  if (main.startsWith(dist) && path.basename(main) === "cli.js") {
    fs.mkdirSync(ledger, { recursive: true, mode: 0o700 });
    const models = path.join(ledger, "models.json");
    if (!fs.existsSync(models)) fs.writeFileSync(models, METER.models, { mode: 0o600 });
    process.env.PI_CODING_AGENT_DIR = ledger;
    process.env.PI_OFFLINE = "1";
    process.env.PI_SKIP_VERSION_CHECK = "1";
    if (METER.variable) process.env[METER.variable] = METER.standIn;
    if (!process.argv.includes("--no-mcp")) process.argv.splice(2, 0, "--no-mcp");
  }
} catch {
  // A folder that cannot be made: the program runs as it is (a pi without the meter has no key).
}
