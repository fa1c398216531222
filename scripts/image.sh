#!/usr/bin/env bash
# Build the refcntd OCI image (configs/container/Containerfile) without a registry:
# its Debian 13 base is a root file system made here with debootstrap from the
# Debian registry and imported into podman.  Installs debootstrap and podman from
# Debian when missing.  As root, from anywhere in a clone:
#   bash scripts/image.sh [TAG]          (default tag: localhost/refcntd:latest)
# Where a registry can be reached, `podman build -f configs/container/Containerfile .`
# alone is enough (its default base is debian:trixie-slim).
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-localhost/refcntd:latest}
base=localhost/debian-debootstrap:trixie
if [ "$(id -u)" != 0 ]; then
    echo "image.sh: run as root (debootstrap and podman)" >&2
    exit 1
fi
for pkg in debootstrap podman; do
    command -v "$pkg" >/dev/null \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
done
if ! podman image exists "$base"; then
    root=$(mktemp -d /var/tmp/refcntd-base.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian >/dev/null
    printf 'deb http://deb.debian.org/debian trixie main\ndeb http://deb.debian.org/debian trixie-updates main\ndeb http://deb.debian.org/debian-security trixie-security main\n' \
        > "$root/etc/apt/sources.list"
    # This machine's own CAs (a TLS proxy in front of the registries), and pip told
    # to use the system bundle: an image built elsewhere gets none of this.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$root/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | podman import --quiet - "$base" >/dev/null
fi
# chroot isolation: the build needs no OCI runtime (crun refuses this machine's hybrid
# cgroups; see docs/install.md#the-oci-image)
podman build --quiet --isolation chroot --network host --build-arg BASE="$base" \
    -f configs/container/Containerfile -t "$tag" .
echo "image.sh: built $tag"
