// The thread-centric protocol through @langchain/langgraph-sdk: `client.threads.stream`
// starts a run with a command (POST /threads/{id}/commands) and reads its events
// (POST /threads/{id}/stream/events). tests/integration/test_js_client.py runs it against
// a real server and fleet, and checks what it prints: one JSON object.

import { Client } from "@langchain/langgraph-sdk";

const client = new Client({
  apiUrl: process.env.TOOLFLEET_URL,
  apiKey: process.env.TOOLFLEET_API_KEY,
});

function ask(...calls) {
  return { messages: [{ role: "user", content: JSON.stringify({ calls }) }] };
}

function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

const out = {};
const thread = client.threads.stream({ assistantId: "agent" });
const events = [];
thread.onEvent((event) => events.push(event));
out.started = await within(
  thread.run.start({ input: ask(["add", { a: 2, b: 3 }]), multitaskStrategy: "enqueue" }),
  30_000,
  "run.start",
);
out.output = await within(thread.output, 60_000, "output");
out.events = events.map((e) => [e.method, e.params.namespace, e.params.data?.event ?? null]);
out.seqs = events.map((e) => e.seq);
out.threadId = thread.threadId;
out.runs = (await client.runs.list(thread.threadId)).map((r) => [r.run_id, r.status]);
out.unknown = await thread.state.get({}).then(
  () => "no error",
  (err) => String(err?.message ?? err),
);
await thread.close();
console.log(JSON.stringify(out));
