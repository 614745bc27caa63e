#!/usr/bin/env bash
# Installs everything strata and its tests need on Debian 12, idempotently:
# PostgreSQL 15, FUSE, protoc, Chromium (for the report test) and the object
# store emulators. Run as root. Quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15 postgresql-client-15)

command -v fusermount3 >/dev/null || need+=(fuse3)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "== apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
if [ -x scripts/emulators/install.sh ]; then
  scripts/emulators/install.sh
fi
