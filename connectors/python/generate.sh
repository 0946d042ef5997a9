#!/usr/bin/env bash
# Generates the Python stubs of keel.v1 from proto/ into $1 (default: connectors/python/gen, which
# git ignores). Uses protoc with grpc_python_plugin (Debian: protobuf-compiler,
# protobuf-compiler-grpc), or else grpcio-tools' bundled protoc ($PYTHON -m grpc_tools.protoc).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/connectors/python/gen}"
mkdir -p "$out"
protos=("$root"/proto/keel/v1/*.proto)
if command -v protoc >/dev/null 2>&1 && command -v grpc_python_plugin >/dev/null 2>&1; then
  protoc -I "$root/proto" --python_out="$out" --grpc_out="$out" \
    --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" "${protos[@]}"
else
  "${PYTHON:-python3}" -m grpc_tools.protoc -I "$root/proto" --python_out="$out" --grpc_python_out="$out" "${protos[@]}"
fi
