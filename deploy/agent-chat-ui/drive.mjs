// Drives LangChain's Agent Chat UI in headless Chromium against `toolfleet serve`: one
// conversation whose tool calls run on the fleet, then a reload and the thread history.
// run.sh starts the UI and the server; see docs/http-service.md, "Agent Chat UI".
//
//   node drive.mjs --mode direct|proxy --ui URL --api URL --token TOKEN --shots DIR
//
// --api is the server's URL as the page reaches it: the server itself (direct) or the
// UI's /api proxy (proxy). Prints PASS or FAIL per step; exits 1 if a step failed.

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { chromium } from "playwright-core";

const { values: opts } = parseArgs({
  options: {
    mode: { type: "string" },
    ui: { type: "string", default: "http://localhost:3000" },
    api: { type: "string" },
    token: { type: "string", default: "" },
    assistant: { type: "string", default: "agent" },
    shots: { type: "string" },
    chromium: { type: "string", default: process.env.CHROMIUM || "chromium" },
    timeout: { type: "string", default: "120" },
  },
});
if (!["direct", "proxy"].includes(opts.mode) || !opts.api || !opts.shots) {
  console.error(
    "usage: node drive.mjs --mode direct|proxy --api URL --shots DIR [--ui URL] [--token T]",
  );
  process.exit(2);
}

const mode = opts.mode;
const ui = opts.ui.replace(/\/$/, "");
const api = opts.api.replace(/\/$/, "");
const waitMs = Number(opts.timeout) * 1000;
// Told apart from earlier runs' threads in the history by a random tag.
const question = `Survey the workspace (${mode} ${Math.random().toString(36).slice(2, 8)}).`;
const answer = "The workspace is a small Python project";
// What the built-in agent's scripted model calls, all at once, for any question.
const tools = ["list_dir", "grep", "read_file", "run_python", "sleep"];

mkdirSync(opts.shots, { recursive: true });
const results = [];
let failed = false;

function report(ok, step, detail = "") {
  results.push({ ok, step });
  console.log(`${ok ? "PASS" : "FAIL"} ${mode}: ${step}${detail ? ` (${detail})` : ""}`);
  if (!ok) failed = true;
}

async function step(name, body) {
  if (failed) {
    console.log(`SKIP ${mode}: ${name}`);
    return;
  }
  try {
    const detail = await body();
    report(true, name, typeof detail === "string" ? detail : "");
  } catch (error) {
    report(false, name, String(error?.message ?? error).split("\n")[0]);
  }
}

async function shot(page, name) {
  const path = join(opts.shots, `${mode}-${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot ${path}`);
}

const browser = await chromium.launch({
  executablePath: opts.chromium,
  headless: true,
  args: ["--no-sandbox"],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 2000 } });
context.setDefaultTimeout(waitMs);
const page = await context.newPage();

// Everything the page sends, to tell which server it talked to and what came back.
const uiOrigin = new URL(ui).origin;
const apiOrigin = new URL(api).origin;
const toApi = []; // each request to the server, or anywhere but the UI: method, url, origin, key
const refused = []; // answers >= 400 and requests that never got one (CORS, refused)
const consoleErrors = [];
page.on("request", (request) => {
  if (request.url().startsWith(api + "/")) {
    toApi.push({
      method: request.method(),
      url: request.url(),
      origin: new URL(request.url()).origin,
      key: request.headers()["x-api-key"] ?? null,
    });
  } else if (new URL(request.url()).origin !== uiOrigin && request.url().startsWith("http")) {
    toApi.push({
      method: request.method(),
      url: request.url(),
      origin: new URL(request.url()).origin,
      key: null,
    });
  }
});
page.on("response", async (response) => {
  if (response.url().startsWith(api + "/") && response.status() >= 400) {
    let body = "";
    try {
      body = (await response.text()).slice(0, 500);
    } catch {
      // a stream cut short: the status says enough
    }
    refused.push(
      `${response.request().method()} ${response.url()} -> ${response.status()} ${body}`,
    );
  }
});
page.on("requestfailed", (request) => {
  if (!request.url().startsWith(api + "/")) return;
  const error = request.failure()?.errorText;
  if (error === "net::ERR_ABORTED" && request.url().endsWith("/runs/stream")) {
    // Chromium reports some streamed answers as aborted after the page read them to their
    // end (every event there, no abort signal): the steps check what the page shows.
    console.log(`note ${mode}: Chromium reported ${request.method()} ${request.url()} as ${error}`);
    return;
  }
  refused.push(`${request.method()} ${request.url()} -> ${error}`);
});
page.on("console", (message) => {
  if (message.type() === "error") consoleErrors.push(message.text().slice(0, 300));
});

const infoOk = () =>
  page.waitForResponse((r) => r.url() === `${api}/info` && r.request().method() === "GET");

async function expectInfo(waiting) {
  const response = await waiting;
  if (response.status() !== 200) throw new Error(`GET /info answered ${response.status()}`);
  return `GET ${api}/info 200`;
}

try {
  if (mode === "direct") {
    await step("the setup form asks for the deployment", async () => {
      await page.goto(ui);
      await page.getByLabel("Deployment URL").waitFor();
      await page.getByLabel("Assistant / Graph ID").waitFor();
      await page.getByLabel("LangSmith API Key").waitFor();
      return "Deployment URL, Assistant / Graph ID, LangSmith API Key";
    });
    await step("the form connects to the server", async () => {
      await page.getByLabel("Deployment URL").fill(api);
      await page.getByLabel("Assistant / Graph ID").fill(opts.assistant);
      await page.getByLabel("LangSmith API Key").fill(opts.token);
      const info = infoOk();
      await page.getByRole("button", { name: "Continue" }).click();
      return await expectInfo(info);
    });
  } else {
    await step("the page connects through the proxy, no setup form", async () => {
      const info = infoOk();
      await page.goto(ui);
      await page.getByPlaceholder("Type your message...").waitFor();
      if (await page.getByLabel("Deployment URL").count())
        throw new Error("the setup form is shown");
      return await expectInfo(info);
    });
  }

  let threadId = null;
  await step("a message starts a streamed run", async () => {
    const box = page.getByPlaceholder("Type your message...");
    await box.fill(question);
    const run = page.waitForResponse(
      (r) => r.url().startsWith(api + "/threads/") && r.url().endsWith("/runs/stream"),
    );
    await box.press("Enter");
    const response = await run;
    if (response.status() !== 200) throw new Error(`runs/stream answered ${response.status()}`);
    threadId = response.url().split("/threads/")[1].split("/")[0];
    return `POST ${response.url().replace(api, "")} 200`;
  });

  await step("the tool calls and their results are shown", async () => {
    // A call's card is headed by the tool's name, a result's by "Tool Result: <name>".
    const cards = () =>
      page.evaluate(() => {
        const calls = [];
        const results = [];
        for (const h3 of document.querySelectorAll("h3")) {
          const text = h3.textContent.trim();
          if (text.startsWith("Tool Result:")) results.push(text.slice(12).trim());
          else if (h3.firstChild?.nodeType === Node.TEXT_NODE)
            calls.push(h3.firstChild.textContent.trim());
        }
        return { calls, results };
      });
    const deadline = Date.now() + waitMs;
    let seen = await cards();
    const complete = ({ calls, results }) =>
      tools.every((t) => calls.includes(t) && results.includes(t)) &&
      calls.length === results.length;
    while (!complete(seen)) {
      if (Date.now() > deadline) {
        throw new Error(`calls [${seen.calls}], results [${seen.results}]`);
      }
      await page.waitForTimeout(250);
      seen = await cards();
    }
    return `${seen.calls.length} calls (${seen.calls.join(", ")}), ${seen.results.length} results`;
  });

  await step("the final answer is shown and the run ends", async () => {
    await page.getByText(answer).waitFor();
    await page.getByRole("button", { name: "Send" }).waitFor();
    // A stream cut short or an error event makes the UI say so in an error toast.
    const toasts = await page.locator('[data-sonner-toast][data-type="error"]').allTextContents();
    if (toasts.length) throw new Error(`the UI shows an error: ${toasts.join(" | ")}`);
    return `"${answer}...", the Send button back, no error shown`;
  });
  if (!failed) await shot(page, "conversation");

  await step("a reload shows the thread again", async () => {
    const url = new URL(page.url());
    if (url.searchParams.get("threadId") !== threadId) {
      throw new Error(
        `the page's address names thread ${url.searchParams.get("threadId")}, not ${threadId}`,
      );
    }
    await page.reload();
    await page.locator(":not(button) > p", { hasText: question }).waitFor(); // not the history's
    await page.getByText(answer).waitFor();
    const done = await page.locator("h3", { hasText: "Tool Result:" }).count();
    return `thread ${threadId}: the question, ${done} tool results, the answer`;
  });

  await step("the thread history lists the thread", async () => {
    const url = new URL(page.url());
    url.searchParams.set("chatHistoryOpen", "true");
    if (mode === "proxy") {
      // This version of the UI lists past threads only when the server's URL and the
      // assistant are in the page's address: its history ignores NEXT_PUBLIC_*.
      await page.goto(url.toString());
      await page.getByRole("heading", { name: "Thread History" }).waitFor();
      await page.waitForTimeout(2000);
      const listed = await page.getByRole("button", { name: /^Survey the workspace/ }).count();
      console.log(`note ${mode}: with NEXT_PUBLIC_* alone the history lists ${listed} thread(s)`);
      url.searchParams.set("apiUrl", api);
      url.searchParams.set("assistantId", opts.assistant);
    }
    const search = page.waitForResponse((r) => r.url() === `${api}/threads/search`);
    await page.goto(url.toString());
    const response = await search;
    if (response.status() !== 200) throw new Error(`threads/search answered ${response.status()}`);
    const listed = await response.json();
    if (!listed.some((t) => t.thread_id === threadId)) {
      throw new Error(`threads/search did not return thread ${threadId}`);
    }
    await page.getByRole("heading", { name: "Thread History" }).waitFor();
    await page.getByRole("button", { name: question }).first().waitFor();
    return `${listed.length} thread(s), this one listed as "${question}"`;
  });
  if (!failed) await shot(page, "history");

  await step(
    mode === "direct"
      ? "the page sent the token to the server itself"
      : "the page never reached the server nor held the token",
    async () => {
      if (mode === "direct") {
        const other = toApi.filter((r) => r.origin !== apiOrigin);
        const keyless = toApi.filter((r) => r.method !== "OPTIONS" && r.key !== opts.token);
        if (other.length)
          throw new Error(`requests elsewhere: ${other.map((r) => r.url).join(", ")}`);
        if (keyless.length)
          throw new Error(
            `without the token: ${keyless.map((r) => `${r.method} ${r.url}`).join(", ")}`,
          );
        return `${toApi.length} requests to ${apiOrigin}, each with X-Api-Key`;
      }
      const direct = toApi.filter((r) => r.origin !== uiOrigin);
      const keyed = toApi.filter((r) => r.key);
      if (direct.length)
        throw new Error(`requests past the proxy: ${direct.map((r) => r.url).join(", ")}`);
      if (keyed.length)
        throw new Error(`the page sent a key: ${keyed.map((r) => r.url).join(", ")}`);
      return `${toApi.length} requests, all to ${api}, none with a key`;
    },
  );

  await step("no request was refused, no error in the page's console", async () => {
    if (refused.length) throw new Error(refused.join(" | "));
    if (consoleErrors.length) throw new Error(consoleErrors.join(" | "));
    return "";
  });
} catch (error) {
  report(false, "the browser session", String(error?.message ?? error).split("\n")[0]);
} finally {
  if (failed) {
    await shot(page, "failure").catch(() => {});
    for (const line of refused) console.log(`refused: ${line}`);
    for (const line of consoleErrors) console.log(`console error: ${line}`);
  }
  await browser.close();
}

const passed = results.filter((r) => r.ok).length;
console.log(`${mode}: ${passed} passed, ${results.length - passed} failed`);
process.exit(failed ? 1 : 0);
