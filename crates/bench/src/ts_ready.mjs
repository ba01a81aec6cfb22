// Time to ready with the official TypeScript SDK client, for `pi-dispatch-bench --hub`: starts
// `servers` server-everything over stdio (StdioClientTransport), connects all of them at once, lists
// every tool of each (all pages), and prints the milliseconds from the first start to the last tool
// list as one JSON line. Then it closes every client (which ends the servers) and exits.
//
// Its one argument is a JSON object: sdkClient (the SDK's dist/esm/client folder), node, everything
// (server-everything's entry file), servers, env (the servers' environment) and cwd.

import { pathToFileURL } from "node:url";

const config = JSON.parse(process.argv[2]);
const sdk = (file) => import(pathToFileURL(`${config.sdkClient}/${file}`).href);
const { Client } = await sdk("index.js");
const { StdioClientTransport } = await sdk("stdio.js");

const clients = [];

async function ready() {
  const transport = new StdioClientTransport({
    command: config.node,
    args: [config.everything, "stdio"],
    env: config.env,
    cwd: config.cwd,
    stderr: "pipe",
  });
  // Read and thrown away, as the runner keeps only a tail.
  transport.stderr?.resume();
  const client = new Client({ name: "pi-dispatch-bench-ts-sdk", version: "0.0.0" });
  clients.push(client);
  await client.connect(transport);
  const names = [];
  let cursor;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    names.push(...page.tools.map((tool) => tool.name));
    cursor = page.nextCursor;
  } while (cursor !== undefined);
  return names;
}

let code = 0;
try {
  const started = performance.now();
  const tools = await Promise.all(Array.from({ length: config.servers }, ready));
  const ms = performance.now() - started;
  process.stdout.write(`${JSON.stringify({ ms, tools })}\n`);
} catch (error) {
  process.stderr.write(`ts_ready: ${error?.stack ?? error}\n`);
  code = 1;
}
await Promise.allSettled(clients.map((client) => client.close()));
process.exit(code);
