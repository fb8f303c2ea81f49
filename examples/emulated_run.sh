#!/bin/sh
# An offline tour of `tpulab run`. Nothing leaves this machine; state goes to a scratch
# TPULAB_HOME so your real receipts and journal are untouched.
set -eu
export TPULAB_HOME="${TPULAB_HOME:-$(mktemp -d)}"

echo "== 1. The plan: every API request and remote command, nothing contacted"
tpulab run --accelerator v5litepod-4 --emulate --dry-run

echo "== 2. The run, against the embedded emulator"
tpulab run --accelerator v5litepod-4 --emulate

echo "== 3. The same, as a JSON envelope (jq shows the verdict and the teardown)"
if command -v jq >/dev/null 2>&1; then
  tpulab run --accelerator v5litepod-1 --emulate --json | jq '{ok, receipt: .receipt.verdict, sums: .receipt.per_device_sums, teardown: .teardown.status, api_calls}'
else
  tpulab run --accelerator v5litepod-1 --emulate --json
fi

echo "== 4. Against a separately served emulator"
port=8470
tpulab emulator serve --port "$port" >"$TPULAB_HOME/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
sleep 2
tpulab run --accelerator v5litepod-4 --api-endpoint "http://127.0.0.1:$port" --project demo-project --zone us-central1-a
tpulab list --api-endpoint "http://127.0.0.1:$port" --project demo-project --zone us-central1-a
