#!/bin/sh
# report_lua.sh -- the review report made from Lua (fl.report of a compiled
# function, timings measured, checklist given, a hostile parameter name)
# in a real browser: headless Chromium screenshots it (not blank) and
# dumps its DOM (every section, both inline SVGs, the hostile name shown
# as text); the file names nothing on the network; the pass stepper shows
# one step, #step=3 another (a different picture).  Then the REPL's
# `:draw` on the last result.  TAP; the browser part is skipped where
# Chromium is absent.
set -u

fuselab=${FUSELAB:-./fuselab}
src=${FUSELAB_SRC:-.}
out=tests/tmp/viz-report-lua
mkdir -p "$out"
out=$(cd "$out" && pwd)
html=$out/review.html
hbreak=$out/review-break.html
rm -f "$html" "$hbreak" "$out"/shot.png "$out"/shot1.png "$out"/shot3.png "$out"/dom.html \
  "$out"/dom3.html "$out"/drawn.svg

n=0
failed=0
ok() { # ok STATUS DESCRIPTION
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi
}

"$fuselab" "$src/tests/viz/lua_driver.lua" "$html" "$hbreak" >"$out/run.log" 2>&1
ok $? "fl.report wrote the reports"

! grep -Eiq "(src|href|action|xlink:href)[[:space:]]*=[[:space:]]*[\"']?[a-z]*:?//" "$html"
ok $? "no src/href leaves the file"
! grep -Eiq "url\\([\"']?[a-z]*:?//|@import" "$html"
ok $? "no CSS url() or @import leaves the file"
[ "$(grep -c "<script" "$html")" -eq 1 ]
ok $? "exactly one (inline) script: the hostile name opened none"
grep -q "graph break" "$hbreak" && grep -q "item() needs a concrete value" "$hbreak"
ok $? "the report of a function with a break lists the break"

# :draw in the REPL (lines from a pipe after -i run through the REPL loop)
printf 'g = fl.capture(function(x) return (x * 2):relu() end, fl.randn(3, 4));\n42\n:draw %s\ng\n:draw %s\n' \
  "$out/never.svg" "$out/drawn.svg" | "$fuselab" -i /dev/null >"$out/repl.out" 2>"$out/repl.err"
grep -q "cannot draw the last result, a number" "$out/repl.err"
ok $? ":draw on a number says it cannot draw it"
[ ! -e "$out/never.svg" ] && grep -q "drew the last result (fl.Graph) to $out/drawn.svg" "$out/repl.out" &&
  grep -q "<svg" "$out/drawn.svg"
ok $? ":draw FILE draws the last result and says where"

# :draw opens the picture in $FUSELAB_VIEWER without waiting for it (the
# viewer here records its argument, then lingers); :projector on draws in
# large type (node labels at 1.75 x 10 pt); without a viewer nothing opens
rm -f "$out/viewed" "$out/proj.svg" "$out/quiet.svg"
printf '#!/bin/sh\necho "$1" > "%s/viewed.tmp"; mv "%s/viewed.tmp" "%s/viewed"; sleep 2\n' \
  "$out" "$out" "$out" >"$out/viewer.sh"
chmod +x "$out/viewer.sh"
printf 'g = fl.capture(function(x) return (x * 2):relu() end, fl.randn(3, 4));\ng\n:projector on\n:draw %s\n' \
  "$out/proj.svg" | FUSELAB_VIEWER="$out/viewer.sh" "$fuselab" -i /dev/null >"$out/repl2.out" 2>&1
i=0
while [ ! -e "$out/viewed" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$out/viewed" ] && [ "$(cat "$out/viewed")" = "$out/proj.svg" ]
ok $? ":draw opens the picture in \$FUSELAB_VIEWER, not waiting for it to close"
grep -q 'font-size="17.50"' "$out/proj.svg" && grep -q "pictures now drawn for a projector" "$out/repl2.out"
ok $? ":projector on: the next picture is drawn in large type"
printf 'g = fl.capture(function(x) return x + 1 end, fl.randn(3));\ng\n:draw %s\n' "$out/quiet.svg" |
  env -u DISPLAY -u WAYLAND_DISPLAY -u FUSELAB_VIEWER "$fuselab" -i /dev/null >"$out/repl3.out" 2>&1
[ $? -eq 0 ] && grep -q "drew the last result (fl.Graph) to $out/quiet.svg" "$out/repl3.out" &&
  ! grep -q 'font-size="17.50"' "$out/quiet.svg"
ok $? ":draw with no viewer and no desktop draws, opens nothing and does not fail"

browser_bin=
for c in chromium chromium-browser google-chrome; do
  if command -v "$c" >/dev/null 2>&1; then browser_bin=$c; break; fi
done
if [ -z "$browser_bin" ]; then
  echo "ok $((n + 1)) # SKIP chromium not installed (Debian package chromium)"
  echo "1..$((n + 1))"
  exit $failed
fi

# Chromium with no way out: every host name resolves to nothing.
browser() {
  timeout 120 "$browser_bin" --headless --no-sandbox --disable-gpu \
    --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$out/profile" \
    --host-resolver-rules="MAP * ~NOTFOUND" "$@" 2>>"$out/chromium.log"
}

browser --screenshot="$out/shot.png" --window-size=1280,2400 "file://$html" >/dev/null
[ -s "$out/shot.png" ] && [ "$(head -c 8 "$out/shot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
ok $? "headless Chromium took a screenshot"

# Not blank: a uniform page decompresses to a handful of distinct bytes.
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
print('# screenshot: %d bytes of pixels, %d distinct byte values' % (len(raw), len(set(raw))))
sys.exit(0 if len(set(raw)) > 64 else 1)
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
grep -q "cluster_k0" "$out/dom.html"
ok $? "the after graph shows its kernel clusters"
grep -q "&lt;/script&gt;&lt;script&gt;alert(1)" "$out/dom.html"
ok $? "the hostile parameter name is shown as text"
grep -q "stable inference: compile" "$out/dom.html"
ok $? "the checklist's recommendation is there"

# The pass stepper: step 1 shown, the others hidden by the script; at
# #step=3 (optimize's first rewrite) the third shown, with the lines it removed copied in
# from decompose's listing; and the picture differs from step 1's.
grep -q '<div class="step" id="step-1"[^>]*><h3>' "$out/dom.html" &&
  grep -q '<div class="step" id="step-3"[^>]*hidden' "$out/dom.html"
ok $? "the stepper shows step 1 and hides the others"
browser --dump-dom "file://$html#step=3" >"$out/dom3.html"
grep -q '<div class="step" id="step-1"[^>]*hidden' "$out/dom3.html" &&
  ! grep -q '<div class="step" id="step-3"[^>]*hidden' "$out/dom3.html" &&
  grep -Eq 'step 3 of [5-9]' "$out/dom3.html"
ok $? "#step=3 shows the third step (optimize's first rewrite)"
grep -q '<span class="r">' "$out/dom3.html"
ok $? "with the lines optimize removed, struck through"
browser --screenshot="$out/shot1.png" --window-size=1600,1200 "file://$html#step=1" >/dev/null
browser --screenshot="$out/shot3.png" --window-size=1600,1200 "file://$html#step=3" >/dev/null
[ -s "$out/shot1.png" ] && [ -s "$out/shot3.png" ] && ! cmp -s "$out/shot1.png" "$out/shot3.png"
ok $? "the screenshot of #step=3 differs from step 1's"

echo "1..$n"
exit $failed
