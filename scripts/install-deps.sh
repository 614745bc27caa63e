#!/usr/bin/env bash
# Installs what strata needs to run on Debian 12, idempotently: PostgreSQL 15
# (server, client, contrib) and FUSE, and the unprivileged `postgres` OS user.
# Run as root. Quiet when everything is already there. The tests need more
# (Chromium, the object store emulators): scripts/test.sh installs those.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15 postgresql-client-15)
command -v fusermount3 >/dev/null || need+=(fuse3)
if [ "${1:-}" = "--tests" ]; then
  [ -x /usr/bin/chromium ] || need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "== apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
