// useStream (@langchain/langgraph-sdk/react, the hook LangGraph's React chat UIs use)
// against `toolfleet serve`, rendered with react-test-renderer under Node: a chat submits
// a run that fans out tool calls, the page "reloads" mid-run (the component unmounts and
// a new one mounts on the same thread), and the new one rejoins the run with
// reconnectOnMount (sending Last-Event-ID: -1). tests/integration/test_js_client.py runs
// it and checks what it prints: one JSON object.
//
// useStream keeps the running run's id for a rejoin only where `window` exists (a
// browser's sessionStorage by default): here `window` is Node's global object and the
// storage a Map that outlives the unmount, as sessionStorage outlives a reload.

import React from "react";
import TestRenderer from "react-test-renderer";
import { Client } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";

globalThis.window ??= globalThis;

const apiUrl = process.env.TOOLFLEET_URL;
const apiKey = process.env.TOOLFLEET_API_KEY;
const client = new Client({ apiUrl, apiKey });

const kept = new Map();
const storage = {
  getItem: (key) => kept.get(key) ?? null,
  setItem: (key, value) => kept.set(key, String(value)),
  removeItem: (key) => kept.delete(key),
};

function ask(...calls) {
  return { messages: [{ role: "user", content: JSON.stringify({ calls }) }] };
}

const seen = { first: { custom: [] }, second: { custom: [] } };

function Chat({ name, threadId }) {
  const stream = useStream({
    apiUrl,
    apiKey,
    assistantId: "agent",
    threadId,
    reconnectOnMount: () => storage,
    onCustomEvent: (data) => seen[name].custom.push(data),
  });
  seen[name].stream = stream;
  return null;
}

async function until(what, check, seconds = 60) {
  const deadline = Date.now() + seconds * 1000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const out = {};
const thread = await client.threads.create();
const key = `lg:stream:${thread.thread_id}`;

// The first page: submit, and leave once the tool calls are under way.
const page = (name) => React.createElement(Chat, { name, threadId: thread.thread_id });
const first = TestRenderer.create(page("first"));
await until("the first page's history", () => seen.first.stream?.isThreadLoading === false);
seen.first.stream.submit(
  ask(["sleep_for", { seconds: 3, label: "slow" }], ["add", { a: 2, b: 3 }]),
);
await until("the run to start its tool calls", () =>
  seen.first.custom.some((e) => e.toolfleet?.event === "started"),
);
const runId = storage.getItem(key);
out.beforeReload = seen.first.custom.map((e) => e.toolfleet.event);
first.unmount();

// The reloaded page: the same thread, the same storage; it rejoins the run by itself.
const second = TestRenderer.create(page("second"));
await until("the rejoin to start", () => seen.second.stream?.isLoading);
await until(
  "the rejoined run to end",
  () => !seen.second.stream.isLoading && storage.getItem(key) === null,
);
const run = await client.runs.get(thread.thread_id, runId);
out.run = { status: run.status, stored: runId !== null };
out.rejoined = seen.second.custom;
const brief = (m) => ({ type: m.type, content: m.content });
out.state = (await client.threads.getState(thread.thread_id)).values.messages.map(brief);
// Once the stream ends, the hook shows the thread's history, which it fetches again: on
// a busy machine that answer comes a moment after the end.
const shown = () => JSON.stringify(seen.second.stream.messages.map(brief));
try {
  await until("the page to show the run's final messages", () => shown() === JSON.stringify(out.state), 30);
} catch {
  // What it showed instead is in the output: the test names the difference.
}
out.rejoinedMessages = seen.second.stream.messages.map(brief);

// Every event of the run, as the server recorded it: what the rejoin had to replay.
const all = [];
const replay = client.runs.joinStream(thread.thread_id, runId, { streamMode: ["custom"] });
for await (const part of replay) {
  if (part.event === "custom") all.push(part.data);
}
out.recorded = all;
second.unmount();
console.log(JSON.stringify(out));
