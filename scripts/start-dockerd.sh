#!/usr/bin/env bash
# Starts a Docker engine in the background if none answers, and waits until it does.
# Machines of this kind ship only the docker CLI; CI installs docker.io and runs this.
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "start-dockerd: dockerd is not installed (apt-get install -y docker.io)" >&2
  exit 1
fi
log="${DOCKERD_LOG:-/tmp/keel-dockerd.log}"
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then echo "start-dockerd: engine up (log: $log)"; exit 0; fi
  sleep 0.5
done
echo "start-dockerd: the engine did not answer within 30 s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
