#!/bin/sh
# Install Debian's Chromium for the browser end-to-end test when it is missing.
# Playwright's own browser download does not work on these machines; Debian's package does.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "ensure_chromium: need root or sudo to install chromium" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
test -x /usr/bin/chromium || { echo "ensure_chromium: /usr/bin/chromium still missing" >&2; exit 1; }
