// pi's own MCP client (@earendil-works/pi-mcp, as pi 1.6 builds it) calling server-everything's
// `echo` three ways, taking turns: directly over stdio, through the relay a job's pi starts (stdio
// to `pi-dispatch job-relay`, the hub's socket, the hub, the server over stdio), and over the hub's
// loopback HTTP. Prints one JSON line: every kept call's time per way, in µs.
//
// argv[2]: {"piMcp": URL of pi-mcp's index.js, "node", "everything", "relay": [program, ...args],
//           "url", "token", "warmUp", "calls"}
const cfg = JSON.parse(process.argv[2]);
const { McpClient, StdioTransport, StreamableHttpTransport } = await import(cfg.piMcp);

async function open(transport) {
  const client = new McpClient({ name: "pi", version: "1.6.0", requestTimeoutMs: 30000 });
  await client.connect(transport);
  return client;
}

const ways = {
  direct: await open(new StdioTransport({ command: cfg.node, args: [cfg.everything, "stdio"], stderr: "pipe" })),
  relay: await open(new StdioTransport({
    command: cfg.relay[0],
    args: cfg.relay.slice(1),
    env: { PI_DISPATCH_HUB_TOKEN: cfg.token },
    stderr: "pipe",
  })),
  http: await open(new StreamableHttpTransport({ url: cfg.url, headers: { Authorization: `Bearer ${cfg.token}` } })),
};
const names = Object.keys(ways);
const times = Object.fromEntries(names.map((n) => [n, []]));
for (let i = 0; i < cfg.warmUp + cfg.calls; i++) {
  for (let turn = 0; turn < names.length; turn++) {
    const name = names[(i + turn) % names.length];
    const message = `pi-dispatch-bench ${i}`;
    const started = process.hrtime.bigint();
    const result = await ways[name].callTool("echo", { message });
    const took = Number(process.hrtime.bigint() - started) / 1000;
    if (result.content?.[0]?.text !== `Echo: ${message}`) throw new Error(`${name}: echo answered ${JSON.stringify(result)}`);
    if (i >= cfg.warmUp) times[name].push(took);
  }
}
for (const client of Object.values(ways)) await client.close();
process.stdout.write(JSON.stringify(times) + "\n");
