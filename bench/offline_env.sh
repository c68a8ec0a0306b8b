# Source this on a machine with no package index (a GPU box) to run pathprobe from this
# uninstalled checkout: lays out the package (bench/pkgtree.sh), installs carried wheels,
# and puts carried binaries (nginx, h2load, HAProxy, Caddy) on PATH.
#
#   WHEELS=DIR TOOLS=DIR . bench/offline_env.sh
#
# WHEELS: a folder of wheels for what the machine lacks (installed with --target into SITE,
#   default /tmp/site). TOOLS (optional): a folder holding any of
#   ngx/usr/sbin/nginx   (nginx and nginx-common .deb files unpacked with dpkg-deb -x)
#   bin/                 (h2load, haproxy, ... put first on PATH)
#   lib/                 (the shared libraries those need, put on LD_LIBRARY_PATH for them only)
#   caddy.xz             (unpacked into bin/ on first use)
_pp_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_pp_site=${SITE:-/tmp/site}
if [ -n "${WHEELS:-}" ] && [ ! -e "$_pp_site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_pp_site" "$WHEELS"/*.whl && touch "$_pp_site/.installed"
fi
export PYTHONPATH="$("$_pp_root/bench/pkgtree.sh" /tmp/pathprobe-tree):$_pp_site"
export PYTHONUNBUFFERED=1
if [ -n "${TOOLS:-}" ]; then
  _pp_tools=$(cd "$TOOLS" && pwd)
  mkdir -p /tmp/pathprobe-tools/bin
  if [ -e "$_pp_tools/caddy.xz" ] && [ ! -x /tmp/pathprobe-tools/bin/caddy ]; then
    xz -dc "$_pp_tools/caddy.xz" > /tmp/pathprobe-tools/bin/caddy && chmod +x /tmp/pathprobe-tools/bin/caddy
  fi
  # each carried binary runs through a wrapper that gives it the carried libraries, so that
  # nothing else on the machine (python3, torch) loads them
  for _pp_b in "$_pp_tools"/bin/* "$_pp_tools"/ngx/usr/sbin/nginx; do
    [ -x "$_pp_b" ] || continue
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s "$@"\n' "$_pp_tools" "$_pp_b" \
      > "/tmp/pathprobe-tools/bin/$(basename "$_pp_b")"
    chmod +x "/tmp/pathprobe-tools/bin/$(basename "$_pp_b")"
  done
  export PATH="/tmp/pathprobe-tools/bin:$PATH"
fi
