#!/usr/bin/env bash
# Optional check, in a real browser, of the "Agent Chat UI" recipe of docs/http-service.md:
# LangChain's Agent Chat UI (the Next.js template of the npm package create-agent-chat-app)
# against `toolfleet serve` and a worker, on this machine's loopback only, in two modes:
#
#   direct  the page calls the server itself: the server opens CORS for the UI's origin,
#           the setup form is filled in (Deployment URL, Assistant / Graph ID, LangSmith
#           API Key = a token of the server).
#   proxy   the page calls the UI's /api routes, which forward to the server with the
#           token added (NEXT_PUBLIC_API_URL, NEXT_PUBLIC_ASSISTANT_ID, LANGGRAPH_API_URL,
#           LANGSMITH_API_KEY); the server opens no CORS.
#
# Usage: deploy/agent-chat-ui/run.sh [direct|proxy|both]        (default: both)
#
# Needs toolfleet installed with the server extra (its virtualenv active), Node 20+ and npm
# (the npm registry reachable), and Chromium. Not part of CI nor of the tests.
#
# Environment:
#   CHROMIUM  the browser (default: chromium or chromium-browser on PATH)
#   UI_PORT   the UI's port (default 3000, the origin the docs open CORS for)
#   UI_RUN    dev: `next dev` (default); build: `next build`, then `next start`
#   UI_DIR    an installed copy of the UI (from an earlier run with KEEP_UI=1): no install
#   KEEP_UI   1: keep the installed UI (about 1.2 GB) in the work directory at the end
#
# Prints PASS or FAIL per step and the times taken; exits non-zero if a step failed. The
# screenshots and logs stay in the work directory it prints. Everything it starts is
# stopped when it ends, by process id.
set -euo pipefail

UI_PACKAGE=create-agent-chat-app@0.1.6
PASSTHROUGH=langgraph-nextjs-api-passthrough@0.1.4
PLAYWRIGHT=playwright-core@1.65.2
ASSISTANT=agent

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODES=${1:-both}
case $MODES in
  both) MODES="direct proxy" ;;
  direct | proxy) ;;
  *) echo "usage: $0 [direct|proxy|both]" >&2; exit 2 ;;
esac
UI_PORT=${UI_PORT:-3000}
UI_RUN=${UI_RUN:-dev}
case $UI_RUN in dev | build) ;; *) echo "UI_RUN is dev or build" >&2; exit 2 ;; esac

say() { printf '%s\n' "$*"; }
fail() { say "run.sh: $*" >&2; exit 1; }

# --- what it needs ---------------------------------------------------------------------
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n $CHROMIUM && -x $CHROMIUM ]] || fail "no Chromium: install it or set CHROMIUM"
for tool in node npm toolfleet celery python3 curl; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || fail "Node 20 or later is needed (this is $(node --version))"
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_taken "$UI_PORT" && fail "port $UI_PORT is in use: stop what listens there, or set UI_PORT"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agent-chat-ui.XXXXXX")
LOGS=$WORK/logs
SHOTS=$WORK/screenshots
mkdir -p "$LOGS" "$SHOTS"
say "work directory: $WORK"

# --- processes: each in a session of its own, stopped by id ----------------------------
PIDS=()
launch() { # launch NAME DIR COMMAND...: run it in DIR, in the background, its output in logs/NAME.log
  local name=$1 dir=$2
  shift 2
  (cd "$dir" && exec setsid "$@") >"$LOGS/$name.log" 2>&1 &
  LAUNCHED=$!
  PIDS+=("$LAUNCHED")
}
halt() { # halt PID: stop its process group (TERM, then KILL after 10 s)
  local pid=$1 kept=() p
  for p in "${PIDS[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
  PIDS=("${kept[@]}")
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
  local all=("${PIDS[@]}") i
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do halt "${all[i]}"; done
  if [[ ${KEEP_UI:-0} != 1 ]]; then rm -rf "$WORK/ui" "$WORK/driver" "$WORK/package"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() { # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || fail "$what: nothing after ${limit} s (logs in $LOGS)"
    sleep 0.5
  done
}
http_ok() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 300 "$1") == 200 ]]; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
TIMES=()
timed() { TIMES+=("$(printf '%-40s %4d s' "$1" "$2")"); }

# --- the UI: the npm package's Next.js template, in the work directory -----------------
# Its layout loads the Inter font through next/font/google, which downloads it while the
# page compiles. Next's own stand-in for that download (NEXT_FONT_GOOGLE_MOCKED_RESPONSES)
# answers instead, so nothing is fetched: the font file is a placeholder the browser
# rejects, and the page shows in the fallback font.
cat >"$WORK/fonts-offline.cjs" <<'EOF'
const css = `/* latin */
@font-face {
  font-family: 'Inter';
  font-style: normal;
  font-weight: 100 900;
  font-display: swap;
  src: url(offline-placeholder.woff2) format('woff2');
}
`;
module.exports = new Proxy({}, { get: () => css });
EOF

started=$SECONDS
if [[ -n ${UI_DIR:-} ]]; then
  [[ -d $UI_DIR/node_modules/next ]] || fail "UI_DIR=$UI_DIR holds no installed UI"
  UI=$UI_DIR
  say "the UI: $UI (installed before)"
else
  UI=$WORK/ui
  say "the UI: $UI_PACKAGE from the npm registry"
  (cd "$WORK" && npm pack --silent "$UI_PACKAGE" >"$LOGS/npm-pack.log" 2>&1) ||
    fail "npm pack $UI_PACKAGE failed: $LOGS/npm-pack.log"
  tar -xzf "$WORK"/create-agent-chat-app-*.tgz -C "$WORK" package/templates/nextjs
  mv "$WORK/package/templates/nextjs" "$UI"
  rm -rf "$WORK/package" "$WORK"/create-agent-chat-app-*.tgz
  say "npm install (the UI's dependencies, about 700 packages) ..."
  (cd "$UI" && npm install --no-audit --no-fund --loglevel=error "$PASSTHROUGH" >"$LOGS/npm-install.log" 2>&1) ||
    fail "npm install failed: $LOGS/npm-install.log"
fi
# The template has no /api routes; the Agent Chat UI repository's are these: every request
# under /api forwarded to LANGGRAPH_API_URL with LANGSMITH_API_KEY as X-Api-Key, by the npm
# package langgraph-nextjs-api-passthrough (it needs a URL even where the routes go unused).
mkdir -p "$UI/src/app/api/[..._path]"
cat >"$UI/src/app/api/[..._path]/route.ts" <<'EOF'
import { initApiPassthrough } from "langgraph-nextjs-api-passthrough";

export const { GET, POST, PUT, PATCH, DELETE, OPTIONS, runtime } =
  initApiPassthrough({
    apiUrl: process.env.LANGGRAPH_API_URL ?? "http://127.0.0.1:9/LANGGRAPH_API_URL-not-set",
    apiKey: process.env.LANGSMITH_API_KEY,
    runtime: "edge",
  });
EOF
mkdir -p "$WORK/driver"
cp "$HERE/drive.mjs" "$WORK/driver/"
printf '{"private": true, "type": "module"}\n' >"$WORK/driver/package.json"
(cd "$WORK/driver" && npm install --no-audit --no-fund --loglevel=error "$PLAYWRIGHT" >"$LOGS/npm-driver.log" 2>&1) ||
  fail "npm install $PLAYWRIGHT failed: $LOGS/npm-driver.log"
timed "install (npm pack, npm install)" $((SECONDS - started))

# --- the fleet: the embedded Redis and one worker on the demo's sample project ----------
started=$SECONDS
toolfleet sample "$WORK/workspace" >/dev/null
launch redis "$WORK" toolfleet redis --port 0
wait_for 30 "toolfleet redis" grep -qs '^export TOOLFLEET_BROKER_URL=' "$LOGS/redis.log"
BROKER=$(sed -n 's/^export TOOLFLEET_BROKER_URL=//p' "$LOGS/redis.log")
say "broker: $BROKER"
export TOOLFLEET_BROKER_URL=$BROKER
launch worker "$WORK" env TOOLFLEET_WORKSPACE_ROOT="$WORK/workspace" \
  celery -A tool_workers worker -P prefork -c 2 -Q tools,sandbox -n "agent-chat-ui-$$@%h" -E -l INFO
wait_for 90 "the worker" grep -qs ' ready\.' "$LOGS/worker.log"
timed "fleet start (redis, worker)" $((SECONDS - started))

TOKEN=$(python3 -c 'import secrets; print("acu-" + secrets.token_hex(16))')
UI_URL=http://localhost:$UI_PORT
FAILED=()
SERVE_PID=
UI_PID=

start_serve() { # start_serve MODE: `toolfleet serve` on a free port; CORS for the UI in direct
  API_PORT=$(free_port)
  local -a cors=()
  [[ $1 == direct ]] && cors=(TOOLFLEET_CORS_ORIGINS="$UI_URL")
  launch "serve-$1" "$WORK" env -u TOOLFLEET_CORS_ORIGINS TOOLFLEET_API_TOKENS="$TOKEN" \
    TOOLFLEET_MODEL=toolfleet:scripted TOOLFLEET_CHECKPOINT_PATH="$WORK/checkpoints.sqlite" \
    "${cors[@]}" toolfleet serve --port "$API_PORT"
  SERVE_PID=$LAUNCHED
  wait_for 60 "toolfleet serve" http_ok "http://127.0.0.1:$API_PORT/ok"
}

start_ui() { # start_ui MODE: the UI on UI_PORT, configured for the mode
  local -a conf=(NEXT_TELEMETRY_DISABLED=1 NEXT_FONT_GOOGLE_MOCKED_RESPONSES="$WORK/fonts-offline.cjs")
  if [[ $1 == proxy ]]; then
    conf+=(NEXT_PUBLIC_API_URL="$UI_URL/api" NEXT_PUBLIC_ASSISTANT_ID="$ASSISTANT"
      LANGGRAPH_API_URL="http://localhost:$API_PORT" LANGSMITH_API_KEY="$TOKEN")
  fi
  local -a clean=(env -u NEXT_PUBLIC_API_URL -u NEXT_PUBLIC_ASSISTANT_ID
    -u NEXT_PUBLIC_LANGSMITH_API_KEY -u LANGGRAPH_API_URL -u LANGSMITH_API_KEY "${conf[@]}")
  rm -rf "$UI/.next" # NEXT_PUBLIC_* are compiled into the page
  local next=$UI/node_modules/.bin/next
  if [[ $UI_RUN == build ]]; then
    say "next build ($1) ..."
    launch "next-build-$1" "$UI" "${clean[@]}" "$next" build
    wait "$LAUNCHED" || fail "next build failed: $LOGS/next-build-$1.log"
    halt "$LAUNCHED"
    launch "next-$1" "$UI" "${clean[@]}" "$next" start -H 127.0.0.1 -p "$UI_PORT"
  else
    launch "next-$1" "$UI" "${clean[@]}" "$next" dev -H 127.0.0.1 -p "$UI_PORT"
  fi
  UI_PID=$LAUNCHED
  # The first request compiles the page under `next dev` (about a minute on two cores).
  wait_for 600 "the UI's page" http_ok "$UI_URL/"
  if [[ $1 == proxy ]]; then wait_for 300 "the UI's /api routes" http_ok "$UI_URL/api/info"; fi
}

for mode in $MODES; do
  say ""
  say "== $mode =="
  started=$SECONDS
  start_serve "$mode"
  say "toolfleet serve: http://localhost:$API_PORT$([[ $mode == direct ]] && echo " (CORS open for $UI_URL)")"
  start_ui "$mode"
  timed "$mode: server and UI start ($UI_RUN)" $((SECONDS - started))
  started=$SECONDS
  api=http://localhost:$API_PORT
  [[ $mode == proxy ]] && api=$UI_URL/api
  launch "drive-$mode" "$WORK/driver" node drive.mjs --mode "$mode" --ui "$UI_URL" --api "$api" \
    --token "$TOKEN" --assistant "$ASSISTANT" --shots "$SHOTS" --chromium "$CHROMIUM"
  drive=$LAUNCHED
  status=0
  wait "$drive" || status=$?
  halt "$drive"
  cat "$LOGS/drive-$mode.log"
  if ((status != 0)); then
    FAILED+=("$mode")
    say "-- last lines of $LOGS/serve-$mode.log:"
    grep -v ' "GET /ok' "$LOGS/serve-$mode.log" | tail -n 40 || true
    say "-- last lines of $LOGS/next-$mode.log:"
    tail -n 20 "$LOGS/next-$mode.log" || true
  fi
  timed "$mode: browser session" $((SECONDS - started))
  halt "$UI_PID"
  halt "$SERVE_PID"
done

say ""
say "times:"
for line in "${TIMES[@]}"; do say "  $line"; done
say "screenshots: $SHOTS"
say "logs: $LOGS"
if ((${#FAILED[@]})); then
  say "FAILED: ${FAILED[*]}"
  exit 1
fi
say "all modes passed: $MODES"
