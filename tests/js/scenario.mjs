// One chat-UI session against `toolfleet serve`, through @langchain/langgraph-sdk, the
// client LangGraph's JavaScript UIs use. tests/integration/test_js_client.py runs it
// against a real server and fleet, and checks what it prints: one JSON object.
//
// TOOLFLEET_URL and TOOLFLEET_API_KEY name the server; the model is the tests' directed
// one, which calls the tools a user message lists as JSON.

import { Client } from "@langchain/langgraph-sdk";

const client = new Client({
  apiUrl: process.env.TOOLFLEET_URL,
  apiKey: process.env.TOOLFLEET_API_KEY,
});

function ask(...calls) {
  return { messages: [{ role: "user", content: JSON.stringify({ calls }) }] };
}

async function collect(parts) {
  const seen = [];
  for await (const part of parts) seen.push({ event: part.event, data: part.data });
  return seen;
}

const out = {};
const thread = await client.threads.create({ metadata: { client: "js" } });
out.thread = thread;

// A streamed run with every mode a chat UI asks for.
let created = null;
const streamed = await collect(
  client.runs.stream(thread.thread_id, "agent", {
    input: ask(["add", { a: 2, b: 3 }], ["sleep_for", { seconds: 0.2, label: "s" }]),
    streamMode: ["values", "updates", "messages-tuple", "custom"],
    onRunCreated: (meta) => {
      created = meta;
    },
  }),
);
out.stream = {
  created,
  events: streamed.map((p) => p.event),
  custom: streamed.filter((p) => p.event === "custom").map((p) => p.data),
  messages: streamed.filter((p) => p.event === "messages").map((p) => p.data),
  updates: streamed.filter((p) => p.event === "updates").map((p) => Object.keys(p.data)),
  last: streamed.filter((p) => p.event === "values").at(-1)?.data,
};

// A waited run, then the thread's state and its history, page by page.
out.wait = await client.runs.wait(thread.thread_id, "agent", {
  input: ask(["add", { a: 1, b: 1 }]),
});
out.state = await client.threads.getState(thread.thread_id);
const first = await client.threads.getHistory(thread.thread_id, { limit: 3 });
const oldest = first.at(-1).checkpoint;
const next = await client.threads.getHistory(thread.thread_id, {
  limit: 3,
  before: { configurable: { thread_id: thread.thread_id, checkpoint_id: oldest.checkpoint_id } },
});
const all = await client.threads.getHistory(thread.thread_id, { limit: 100 });
out.history = {
  first: first.map((s) => s.checkpoint.checkpoint_id),
  next: next.map((s) => s.checkpoint.checkpoint_id),
  all: all.map((s) => s.checkpoint.checkpoint_id),
};

// A background run, joined; another, whose stream is joined.
const background = await client.runs.create(thread.thread_id, "agent", {
  input: ask(["add", { a: 4, b: 4 }]),
});
out.join = await client.runs.join(thread.thread_id, background.run_id);
const again = await client.runs.create(thread.thread_id, "agent", {
  input: ask(["sleep_for", { seconds: 0.3, label: "j" }]),
  streamMode: ["values", "custom"],
});
const joined = await collect(client.runs.joinStream(thread.thread_id, again.run_id));
out.joinStream = {
  events: joined.map((p) => p.event),
  last: joined.filter((p) => p.event === "values").at(-1)?.data,
};
out.runs = (await client.runs.list(thread.thread_id)).map((r) => r.status);

process.stdout.write(JSON.stringify(out));
