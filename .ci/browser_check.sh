#!/usr/bin/env bash
# The docs site and the HTML reports in a real browser. The site is built first, `mkdocs build
# --strict` (a broken link or a bad reference fails it), and its front page must load clean. Then
# headless Chromium (Debian's package, installed when missing; CI runs as root) loads every page of the
# site at 1400 px, where no numbered list may restart and no code block, table or name in a table may
# be cut (a copy of each page with .ci/docs_check.js measures it), and the `recommend` and `audit`
# reports with no network, which must log no console message, must render their SVG, must at 1400 px
# cut no table and overlap no plot label (a copy of each page with .ci/layout_check.js measures it),
# and saves a screenshot of each at 1400 px.
#
#   bash .ci/browser_check.sh          # pages, logs and screenshots in build/browser-check/
#
# Exit 0 when the site builds and every page loads clean; the screenshots' paths are printed either way.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${BROWSER_CHECK_DIR:-build/browser-check}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if ! command -v chromium >/dev/null 2>&1; then
  echo "browser_check: installing chromium" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

export JAX_PLATFORMS=cpu NO_MKDOCS_2_WARNING=1
python3 -m mkdocs build --strict --quiet --site-dir "$out/docs"
python3 -m te_ckpt_audit_cli recommend sample_models/eight_names.py:loss --budget 6000B --format html \
  --output "$out/recommend.html"
python3 -m te_ckpt_audit_cli audit sample_models/te_transformer.py:loss --format html --output "$out/audit.html"

status=0
docs_flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
  --disable-component-update --disable-sync --host-resolver-rules="MAP * ~NOTFOUND" --enable-logging=stderr --v=0)
profile="$(mktemp -d)"
timeout 120 chromium "${docs_flags[@]}" --user-data-dir="$profile" --window-size=1400,1800 \
  --screenshot="$out/docs.png" "file://$out/docs/index.html" 2>"$out/docs.log" >/dev/null
rm -rf "$profile"
if grep ":CONSOLE" "$out/docs.log" >&2 || [ ! -s "$out/docs.png" ]; then
  echo "browser_check: the docs' front page logged console messages or gave no screenshot" >&2
  status=1
fi
echo "browser_check: screenshot $out/docs.png"
# Every page of the site at 1400 px: lists, code blocks and tables whole (.ci/docs_check.js).
pages=0
while IFS= read -r page; do
  check="${page%.html}.check.html"
  { cat "$page"; echo "<script>"; cat .ci/docs_check.js; echo "</script>"; } >"$check"  # as the reports' check below
  profile="$(mktemp -d)"
  timeout 120 chromium "${docs_flags[@]}" --user-data-dir="$profile" --window-size=1400,1800 \
    --dump-dom "file://$check" >"$check.dom" 2>>"$out/docs.log"
  rm -rf "$profile"
  verdict="$(sed -n '/id="docs-check"/,/<\/pre>/p' "$check.dom")"
  rm -f "$check" "$check.dom"
  pages=$((pages + 1))
  if ! grep -q "docs ok" <<<"$verdict"; then
    echo "browser_check: ${page#"$out"/docs/} at 1400 px: ${verdict:-no verdict (the check did not run)}" >&2
    status=1
  fi
done < <(find "$out/docs" -name index.html -not -path "*/search/*" | sort)
echo "browser_check: $pages pages of the site checked at 1400 px"
for page in recommend audit; do
  profile="$(mktemp -d)"  # a new, empty profile every run: nothing cached, nothing remembered
  flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
    --disable-component-update --disable-sync --user-data-dir="$profile"
    --host-resolver-rules="MAP * ~NOTFOUND" --enable-logging=stderr --v=0)
  url="file://$out/$page.html"
  # Page console messages (errors, warnings, logs) come on stderr as ":CONSOLE" lines.
  timeout 120 chromium "${flags[@]}" --dump-dom "$url" >"$out/$page.dom" 2>"$out/$page.log"
  if grep ":CONSOLE" "$out/$page.log" >&2; then
    echo "browser_check: $page.html logged console messages (above)" >&2
    status=1
  fi
  svgs="$(grep -o "<svg" "$out/$page.dom" | wc -l)"
  if [ "$svgs" -lt 2 ] || ! grep -q "Per-equation marks" "$out/$page.dom"; then
    echo "browser_check: $page.html did not render its plots and tables ($svgs svg)" >&2
    status=1
  fi
  # the audit page as rendered (issue 41, items 1-4): its warning, the arguments folded, no empty
  # error column, the hotspots under a heading that says what the rows are and how many
  if [ "$page" = audit ] && ! { grep -q "<h2>Warnings (1)</h2>" "$out/$page.dom" &&
      grep -q "te-gemms-recomputed" "$out/$page.dom" && grep -q "<details" "$out/$page.dom" &&
      ! grep -q "<th>error</th>" "$out/$page.dom" &&
      grep -q "<h2>Largest residuals by source line (top 10)</h2>" "$out/$page.dom"; }; then
    echo "browser_check: audit.html lacks its warning, its folded arguments or its hotspots' heading, or has an empty error column" >&2
    status=1
  fi
  { cat "$out/$page.html"; echo "<script>"; cat .ci/layout_check.js; echo "</script>"; } >"$out/$page.layout.html"
  timeout 120 chromium "${flags[@]}" --window-size=1400,2000 --dump-dom "file://$out/$page.layout.html" \
    >"$out/$page.layout.dom" 2>>"$out/$page.log"
  layout="$(sed -n '/id="layout-check"/,/<\/pre>/p' "$out/$page.layout.dom")"
  if ! grep -q "layout ok" <<<"$layout"; then
    echo "browser_check: $page.html at 1400 px: ${layout:-no verdict (the check did not run)}" >&2
    status=1
  fi
  timeout 120 chromium "${flags[@]}" --screenshot="$out/$page.png" --window-size=1400,2400 "$url" \
    2>>"$out/$page.log" >/dev/null
  rm -rf "$profile"
  if [ ! -s "$out/$page.png" ]; then
    echo "browser_check: no screenshot of $page.html" >&2
    status=1
  fi
  echo "browser_check: screenshot $out/$page.png"
done
exit "$status"
