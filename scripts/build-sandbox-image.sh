#!/usr/bin/env bash
# Builds Keel's default sandbox image without any registry: a root filesystem holding
# Debian's busybox-static, one symlink per applet, and a non-root user, imported with
# `docker import`. Users with a registry can name any image in the agent spec instead.
set -euo pipefail
image="${1:-keel/sandbox-base:busybox}"
if docker image inspect "$image" >/dev/null 2>&1 && [ "${KEEL_REBUILD_IMAGE:-0}" != 1 ]; then
  echo "build-sandbox-image: $image already present"; exit 0
fi
busybox_bin="$(command -v busybox || true)"
if [ -z "$busybox_bin" ] || ! file "$busybox_bin" 2>/dev/null | grep -q "statically linked"; then
  busybox_bin=/bin/busybox
fi
if [ ! -x "$busybox_bin" ]; then
  echo "build-sandbox-image: busybox not found (apt-get install -y busybox-static)" >&2; exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/workspace" "$root/home/sandbox"
cp "$busybox_bin" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
# uid/gid 10001: an unprivileged user that owns nothing on the host.
printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:10001:10001:sandbox:/home/sandbox:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\nsandbox:x:10001:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
chown 10001:10001 "$root/workspace" "$root/home/sandbox"
tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' -c 'USER 10001:10001' -c 'WORKDIR /workspace' - "$image" >/dev/null
# The id is what the docker backend pins workspaces to when it first uses the tag.
echo "build-sandbox-image: built $image ($(docker image inspect -f '{{.Id}}' "$image"))"
