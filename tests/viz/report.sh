#!/bin/sh
# report.sh -- the review report in a real browser: report_driver writes a
# report with every section filled, headless Chromium screenshots it (the
# picture must not be blank) and dumps its DOM (the sections and both
# inline SVGs must be there, hostile text escaped), and the file must not
# name anything on the network.  TAP; skipped where Chromium is absent.
set -u

driver=${REPORT_DRIVER:-./tests/viz/report_driver}
out=tests/tmp/viz-report

browser_bin=
for c in chromium chromium-browser google-chrome; do
  if command -v "$c" >/dev/null 2>&1; then browser_bin=$c; break; fi
done
if [ -z "$browser_bin" ]; then
  echo "1..0 # SKIP chromium not installed (Debian package chromium)"
  exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
html=$out/review.html
rm -f "$html" "$out/shot.png" "$out/dom.html" "$out/dom2.html"

n=0
failed=0
ok() { # ok STATUS DESCRIPTION
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi
}

# Chromium with no way out: every host name resolves to nothing.
browser() {
  timeout 120 "$browser_bin" --headless --no-sandbox --disable-gpu \
    --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$out/profile" \
    --host-resolver-rules="MAP * ~NOTFOUND" "$@" 2>>"$out/chromium.log"
}

"$driver" "$html" "$out/before.svg"
ok $? "report_driver wrote the report"

! grep -Eiq "(src|href|action|xlink:href)[[:space:]]*=[[:space:]]*[\"']?[a-z]*:?//" "$html"
ok $? "no src/href leaves the file"
! grep -Eiq "url\\([\"']?[a-z]*:?//|@import" "$html"
ok $? "no CSS url() or @import leaves the file"
! grep -q "<script>alert" "$html"
ok $? "hostile code text is escaped"
[ "$(grep -c "<script" "$html")" -eq 1 ]
ok $? "exactly one (inline) script"

if command -v xmllint >/dev/null 2>&1; then
  xmllint --noout "$out/before.svg" 2>>"$out/xmllint.log"
  ok $? "the SVG fed to the report is well-formed XML (xmllint)"
fi

browser --screenshot="$out/shot.png" --window-size=1280,2000 "file://$html" >/dev/null
[ -s "$out/shot.png" ] && [ "$(head -c 8 "$out/shot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
ok $? "headless Chromium took a screenshot"

# Not blank: a uniform page decompresses to a handful of distinct bytes;
# text, tables and graphs give a wide spread.
if command -v python3 >/dev/null 2>&1; then
  python3 - "$out/shot.png" <<'PY'
import sys, zlib
d = open(sys.argv[1], 'rb').read()
i, idat = 8, b''
while i < len(d):
    ln = int.from_bytes(d[i:i+4], 'big'); typ = d[i+4:i+8]
    if typ == b'IDAT': idat += d[i+8:i+8+ln]
    i += 12 + ln
raw = zlib.decompress(idat)
distinct = len(set(raw))
print('# screenshot: %d bytes of pixels, %d distinct byte values' % (len(raw), distinct))
sys.exit(0 if distinct > 64 else 1)
PY
  ok $? "the screenshot is not blank"
else
  [ "$(wc -c <"$out/shot.png")" -gt 40000 ]
  ok $? "the screenshot is not blank (by size)"
fi

browser --dump-dom "file://$html" >"$out/dom.html"
ok $? "headless Chromium dumped the DOM"
for id in summary graphs kernels decisions code guards breaks timings checklist \
          graph-before graph-after; do
  grep -q "id=\"$id\"" "$out/dom.html"
  ok $? "DOM holds #$id"
done
[ "$(grep -o "<svg" "$out/dom.html" | wc -l)" -ge 2 ]
ok $? "DOM holds the before and after SVGs"
grep -q "cluster_k0" "$out/dom.html" && grep -q "fused_matmul_softmax_8x64" "$out/dom.html"
ok $? "the after graph shows its kernel clusters"
grep -q "&lt;/code&gt;&lt;/pre&gt;&lt;script&gt;alert(1)" "$out/dom.html"
ok $? "generated code shown as text"
grep -q '<span class="ln">7</span>' "$out/dom.html"
ok $? "code lines numbered"
grep -q 'id="steps"' "$out/dom.html" && grep -q 'step 1 of 3' "$out/dom.html"
ok $? "DOM holds the pass stepper, at step 1"
browser --dump-dom "file://$html#step=2" >"$out/dom2.html"
grep -q '<span class="r">  %2 = mul(%0, %1)' "$out/dom2.html" &&
  grep -q '<span class="c" title="was: %3 = relu(%2)' "$out/dom2.html"
ok $? "#step=2: the removed line struck through in place, the changed one with what it was"
grep -q '&lt;/pre&gt;&lt;script&gt;alert(1)' "$out/dom2.html"
ok $? "a hostile name in a listing shown as text"

echo "1..$n"
exit $failed
