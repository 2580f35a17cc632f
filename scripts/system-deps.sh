#!/usr/bin/env bash
# Debian packages that some real-data and browser tests use: chromium + chromium-driver (the attention
# explorer's browser test), the SWORD Bible modules (en-es verse pairs) and wordnet-base (supersense glosses).
# Installed only when missing and when this user may (root with apt-get); otherwise the tests that need them
# skip and say why.
set -u
need=()
for pkg in chromium chromium-driver sword-text-web sword-text-sparv libsword-utils wordnet-base; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian packages: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; }; then
    echo "warning: apt-get install ${need[*]} failed; the tests that need them will skip" >&2
  fi
else
  echo "note: not root, so not installing ${need[*]}; the tests that need them skip with a reason" >&2
fi
exit 0
