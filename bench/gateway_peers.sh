#!/usr/bin/env bash
# Side by side, in one run, against the same fake OpenAI upstream, with wrk as the load
# generator (a Python one tops out near 1k req/s here): upstream direct, a bare Serve
# passthrough, LiteLLM's proxy, Portkey's gateway, and switchyard's gateway with its shipped
# governance (flows qa/plain, class internal, and support/reply, class personal).
#
#   RAY_ADDRESS= flock /tmp/switchyard-ray.lock bench/gateway_peers.sh [seconds per cell, default 15]
#
# The peers are installed into bench/.peers/ (gitignored) and never become project
# dependencies: wrk from Debian (`apt-get download` + `dpkg -x`, no root install), LiteLLM's
# proxy in its own venv from PyPI, Portkey's gateway from npm. Needs network on first run.
set -euo pipefail

cd "$(dirname "$0")/.."
SECONDS_PER=${1:-15}
PEERS=bench/.peers
LITELLM_VERSION=1.108.7
PORTKEY_VERSION=1.15.2
mkdir -p "$PEERS"
RUN=$(mktemp -d)
pids=()

say() { echo "gateway_peers: $*" >&2; }

serve_pid=""
cleanup() {
  touch "$RUN/targets.json.stop"  # gateway_serve.py --serve-only shuts Serve down on it
  # ... and with Serve its HAProxy, which Ray starts in a session of its own: killing the
  # process group first would leave HAProxy holding its ports (9101, 8404) for the next run.
  if [ -n "$serve_pid" ]; then
    for _ in $(seq 120); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.5; done
  fi
  for pid in "${pids[@]}"; do
    kill -- "-$pid" 2>/dev/null || true  # each was started with setsid: its own process group
  done
  wait 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT

install_wrk() {
  [ -x "$PEERS/wrk/usr/bin/wrk" ] && return
  say "installing wrk (Debian package, unpacked into $PEERS/wrk)"
  (cd "$PEERS" && apt-get download wrk libluajit2-5.1-2 >&2 && for deb in wrk_*.deb libluajit2-*.deb; do dpkg -x "$deb" wrk; done)
}

install_litellm() {
  [ -x "$PEERS/litellm-venv/bin/litellm" ] && return
  say "installing LiteLLM's proxy $LITELLM_VERSION into $PEERS/litellm-venv"
  python3 -m venv "$PEERS/litellm-venv"
  "$PEERS/litellm-venv/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION" >&2
}

install_portkey() {
  [ -f "$PEERS/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" ] && return
  say "installing Portkey's gateway $PORTKEY_VERSION into $PEERS/portkey"
  npm install --silent --prefix "$PEERS/portkey" "@portkey-ai/gateway@$PORTKEY_VERSION" >&2
}

free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_for() {  # url: until it answers at all (any status), 120 s at most
  for _ in $(seq 240); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.5
  done
  say "$1 did not come up"; return 1
}

install_wrk
install_litellm
install_portkey
WRK="$PEERS/wrk/usr/bin/wrk"
export LD_LIBRARY_PATH="$PWD/$PEERS/wrk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

say "starting the fake upstream, the Serve passthrough and switchyard's gateway"
setsid nice .venv/bin/python bench/gateway_serve.py --serve-only "$RUN/targets.json" >"$RUN/serve.log" 2>&1 &
serve_pid=$!
pids+=("$serve_pid")
for _ in $(seq 360); do [ -s "$RUN/targets.json" ] && break; sleep 0.5; done
[ -s "$RUN/targets.json" ] || { tail -30 "$RUN/serve.log" >&2; exit 1; }
UPSTREAM=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["upstream"])' "$RUN/targets.json")
KEY=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "tests/gateway"); from gw_fakes import OPENAI_KEY; print(OPENAI_KEY)')

LITELLM_PORT=$(free_port)
LITELLM_KEY=sk-bench-$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(16))')
cat >"$RUN/litellm.yaml" <<EOF
model_list:
  - model_name: gpt-4o-mini
    litellm_params:
      model: openai/gpt-4o-mini
      api_base: $UPSTREAM/v1
      api_key: $KEY
litellm_settings:
  telemetry: false
general_settings:
  master_key: $LITELLM_KEY  # LiteLLM refuses to start without one
EOF
say "starting LiteLLM's proxy on :$LITELLM_PORT"
LITELLM_TELEMETRY=False LITELLM_LOCAL_MODEL_COST_MAP=True setsid "$PEERS/litellm-venv/bin/litellm" --config "$RUN/litellm.yaml" --host 127.0.0.1 \
  --port "$LITELLM_PORT" --num_workers 1 >"$RUN/litellm.log" 2>&1 &
litellm_pid=$!
pids+=("$litellm_pid")

PORTKEY_PORT=$(free_port)
say "starting Portkey's gateway on :$PORTKEY_PORT"
setsid node "$PEERS/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" --port="$PORTKEY_PORT" \
  >"$RUN/portkey.log" 2>&1 &
portkey_pid=$!
pids+=("$portkey_pid")

wait_for "http://127.0.0.1:$LITELLM_PORT/health/liveliness"
wait_for "http://127.0.0.1:$PORTKEY_PORT/"

# The peers join the targets, in the table's order: upstream, passthrough, LiteLLM, Portkey, switchyard.
.venv/bin/python - "$RUN/targets.json" "$UPSTREAM" "$KEY" "$LITELLM_PORT" "$litellm_pid" "$PORTKEY_PORT" "$portkey_pid" \
  "$LITELLM_KEY" <<'EOF'
import json, sys
path, upstream, key, lport, lpid, pport, ppid, lkey = sys.argv[1:]
data = json.load(open(path))
t = data["targets"]
body = {"model": "gpt-4o-mini", "messages": t["upstream direct"]["body"]["messages"]}
peers = {
    "LiteLLM proxy": {"url": f"http://127.0.0.1:{lport}/v1/chat/completions",
                      "headers": {"authorization": f"Bearer {lkey}"}, "body": body,
                      "pids": [int(lpid)]},
    "Portkey gateway": {"url": f"http://127.0.0.1:{pport}/v1/chat/completions",
                        "headers": {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{upstream}/v1",
                                    "authorization": f"Bearer {key}"},
                        "body": body, "pids": [int(ppid)]},
}
order = ["upstream direct", "serve passthrough", "LiteLLM proxy", "Portkey gateway", "gateway qa/plain",
         "gateway support/reply"]
merged = {**t, **peers}
data["targets"] = {name: merged[name] for name in order}
json.dump(data, open(path, "w"), indent=1)
EOF
for name in "LiteLLM proxy" "Portkey gateway"; do  # each must answer 200 before it is measured
  .venv/bin/python - "$RUN/targets.json" "$name" <<'EOF'
import json, sys
import httpx
t = json.load(open(sys.argv[1]))["targets"][sys.argv[2]]
r = httpx.post(t["url"], json=t["body"], headers=t["headers"], timeout=60)
assert r.status_code == 200, f"{sys.argv[2]}: {r.status_code} {r.text[:300]}"
EOF
done

say "measuring ($SECONDS_PER s per cell)"
.venv/bin/python bench/gateway_peers_wrk.py "$RUN/targets.json" "$WRK" --seconds "$SECONDS_PER"
echo "LiteLLM $LITELLM_VERSION, Portkey gateway $PORTKEY_VERSION; reproduce: RAY_ADDRESS= flock /tmp/switchyard-ray.lock bench/gateway_peers.sh $SECONDS_PER"
