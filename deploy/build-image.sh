#!/usr/bin/env bash
# Builds the `sealion:local` image without pulling anything: the image is the
# sealion binary plus exactly the shared libraries it links, imported with
# `docker import`. This works on a Docker engine with no registry and on one
# with a normal registry alike.
#
#   deploy/build-image.sh                 # cargo build --release, then the image
#   SEALION_BIN=path/to/sealion deploy/build-image.sh   # use an existing binary
#   SEALION_IMAGE=name:tag ...            # another image name (default sealion:local)
set -euo pipefail
cd "$(dirname "$0")/.."
image="${SEALION_IMAGE:-sealion:local}"
bin="${SEALION_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --locked -p sealion
  bin="${CARGO_TARGET_DIR:-target}/release/sealion"
fi
[ -x "$bin" ] || { echo "no sealion binary at $bin" >&2; exit 1; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$root/data"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/local/bin/sealion"
# The binary's shared libraries and the dynamic loader, at the same paths.
for lib in $(ldd "$bin" | grep -o '/[^ ]*' | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
echo 'root:x:0:0:root:/root:/sbin/nologin' > "$root/etc/passwd"
echo 'root:x:0:' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"

tar -C "$root" -c . | docker import \
  --change 'ENTRYPOINT ["/usr/local/bin/sealion"]' \
  --change 'WORKDIR /data' \
  --change 'ENV RUST_LOG=info' \
  - "$image" >/dev/null
echo "built image $image from $bin"
