/*
** report.c -- the self-contained HTML review report.
** Invariant: every byte of user-derived text goes through viz_esc, and the
** document references nothing outside itself (no src/href to any URL; the
** only links are #fragment anchors), so it opens offline, from a mail
** attachment, and prints the same everywhere.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/roofline.h"
#include "graph/file.h"
#include "viz/report.h"
#include "viz/style.h"

/* Screen and print styles.  Print: no controls, graphs shrink to a page,
** long code wraps instead of being cut at the margin. */
static const char css[] =
  ":root{--ink:#1a1a1a;--mute:#5f6368;--line:#dadce0;--bg:#fff;--soft:#f6f8fb;"
  "--accent:#3d6aa8;--good:#2e7d32;--bad:#c62828;--warn:#a86b00}\n"
  "*{box-sizing:border-box}\n"
  "body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;"
  "color:var(--ink);background:var(--bg)}\n"
  "main{max-width:1240px;margin:0 auto;padding:0 24px 48px}\n"
  "header{background:#24324a;color:#fff;padding:20px 24px 14px}\n"
  "header .in{max-width:1240px;margin:0 auto}\n"
  "header h1{margin:0;font-size:24px}header .sub{margin:4px 0 10px;color:#c9d3e6}\n"
  "nav a{color:#dfe7f5;margin-right:14px;text-decoration:none;font-size:13px}\n"
  "nav a:hover{text-decoration:underline}\n"
  "section{margin-top:28px}\n"
  "h2{font-size:18px;border-bottom:2px solid var(--line);padding-bottom:4px;margin:0 0 12px}\n"
  "h3{font-size:15px;margin:14px 0 6px}\n"
  ".none{color:var(--mute);font-style:italic}\n"
  ".cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px}\n"
  ".card{background:var(--soft);border:1px solid var(--line);border-radius:8px;padding:10px 12px}\n"
  ".card .v{font-size:19px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-weight:600}.card .k{color:var(--mute);font-size:12px}\n"
  ".pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px}\n"
  "figure{margin:0;border:1px solid var(--line);border-radius:8px;overflow:hidden}\n"
  "figcaption{background:var(--soft);padding:6px 10px;font-weight:600;"
  "display:flex;justify-content:space-between;align-items:center;gap:8px}\n"
  ".zoombar button{font:inherit;font-size:12px;border:1px solid var(--line);background:#fff;"
  "border-radius:4px;padding:1px 8px;margin-left:4px;cursor:pointer}\n"
  ".zoom{overflow:hidden;cursor:grab;background:#fff;touch-action:none}\n"
  ".zoom.grabbing{cursor:grabbing}\n"
  ".zoom svg{display:block;width:100%;height:100%}\n"
  ".hint{color:var(--mute);font-size:12px;margin:6px 0 0}\n"
  "table{border-collapse:collapse;width:100%;font-size:13px}\n"
  "th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}\n"
  "th{background:var(--soft);font-weight:600}\n"
  "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\n"
  "tr.total td{font-weight:600;border-top:2px solid var(--line)}\n"
  ".yes{color:var(--good);font-weight:600}.no{color:var(--mute)}\n"
  "code{font:12.5px/1.4 ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}\n"
  "pre.code{background:#fbfbfd;border:1px solid var(--line);border-radius:8px;padding:8px 0;"
  "overflow:auto;max-height:640px;margin:0}\n"
  "pre.code .ln{display:inline-block;width:4em;padding-right:1em;text-align:right;"
  "color:#9aa0a6;user-select:none;border-right:1px solid var(--line);margin-right:.8em}\n"
  "ul.plain{margin:0;padding-left:20px}\n"
  ".bar{height:12px;background:var(--accent);border-radius:3px;min-width:2px}\n"
  ".note{color:#666;font-size:12px;margin-top:2px}"
  ".bar.cold{background:#c46a1a}.bar.eager{background:#8c8c8c}\n"
  ".verdict{font-weight:700}.v1{color:var(--good)}.v0{color:var(--mute)}.v-1{color:var(--bad)}\n"
  ".reco{margin-top:10px;padding:10px 14px;border-left:4px solid var(--accent);background:var(--soft)}\n"
  "footer{color:var(--mute);font-size:12px;margin-top:36px}\n"
  /* the pass stepper: read from the back of a room (14 px and up) */
  ".stepbar{display:flex;flex-wrap:wrap;align-items:center;gap:12px;padding:8px 0;"
  "border-bottom:1px solid var(--line)}\n"
  ".stepbar button{font:inherit;font-size:17px;padding:6px 18px;border:1px solid #b9c3d3;border-radius:6px;"
  "background:var(--soft);cursor:pointer}\n"
  ".stepbar button:disabled{opacity:.4;cursor:default}\n"
  ".st-pos{font-size:18px;font-weight:600}.st-keys{color:var(--mute);font-size:14px}\n"
  "ol.st-list{display:flex;flex-wrap:wrap;gap:6px;list-style:none;padding:0;margin:10px 0}\n"
  "ol.st-list a{display:inline-block;padding:3px 12px;border-radius:16px;border:1px solid var(--line);"
  "text-decoration:none;color:var(--ink);font-size:15px}\n"
  "ol.st-list a.on{background:var(--accent);color:#fff;border-color:var(--accent)}\n"
  ".legend{font-size:15px;margin:4px 0 10px}.legend span{padding:1px 8px;border-radius:4px;margin-right:6px}\n"
  ".step h3{font-size:20px;margin:12px 0 4px}\n"
  ".st-sum{font-size:18px;font-weight:600;margin:4px 0}\n"
  "ul.st-notes{font-size:16px;margin:2px 0 10px;padding-left:22px}\n"
  "pre.ir{font:15px/1.45 ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;max-height:64vh;"
  "overflow:auto;border:1px solid var(--line);border-radius:8px;background:#fbfbfd;padding:6px 0;margin:0}\n"
  "pre.ir span{display:block;padding:0 12px 0 0;white-space:pre}\n"
  "pre.ir span::before{content:'  ';color:var(--mute)}\n"
  ".a{background:#dff3e4;color:#0b5a1c}pre.ir .a::before{content:'+ '}\n"
  ".c{background:#fff0c9;color:#6e4700}pre.ir .c::before{content:'~ '}\n"
  ".r,html:not(.js) pre.ir .x{background:#fde4e4;color:#9b1c1c;text-decoration:line-through}\n"
  "pre.ir .r::before,html:not(.js) pre.ir .x::before{content:'- '}\n"
  "html.js .nojs{display:none}\n"
  "pre.st-code{max-height:64vh}pre.st-code code{font-size:15px}\n"
  "@media print{\n"
  " header{background:none;color:#000;padding:0}header .sub{color:#444}nav,.zoombar,.hint{display:none}\n"
  " main{max-width:none;padding:0}\n"
  " .pair{display:block}figure{margin-bottom:12px;break-inside:avoid}\n"
  " .zoom{height:auto!important;overflow:visible}\n"
  " .zoom svg{width:100%;height:auto;max-height:24cm}\n"
  " pre.code{max-height:none;overflow:visible;white-space:pre-wrap}\n"
  " tr{break-inside:avoid}h2{break-after:avoid}\n"
  " .stepbar,ol.st-list{display:none}.step[hidden]{display:block}\n"
  " pre.ir{max-height:none;overflow:visible}\n"
  "}\n";

/* Pan (drag), zoom (buttons, Ctrl+wheel) and reset (double-click) by
** moving each SVG's viewBox; printing restores the whole picture. */
static const char js[] =
  "(function(){\n"
  "var all=[];\n"
  "document.querySelectorAll('figure.graph').forEach(function(fig){\n"
  " var box=fig.querySelector('.zoom'),svg=box&&box.querySelector('svg');\n"
  " if(!svg||!svg.getAttribute('viewBox'))return;\n"
  " var vb0=svg.getAttribute('viewBox').trim().split(/[\\s,]+/).map(Number),vb=vb0.slice(),drag=null;\n"
  " function apply(){svg.setAttribute('viewBox',vb.join(' '));}\n"
  " function reset(){vb=vb0.slice();apply();}\n"
  " function zoom(f,cx,cy){var w=vb[2]*f,h=vb[3]*f;vb[0]+=(vb[2]-w)*cx;vb[1]+=(vb[3]-h)*cy;"
  "vb[2]=w;vb[3]=h;apply();}\n"
  " box.addEventListener('wheel',function(ev){if(!ev.ctrlKey&&!ev.metaKey)return;ev.preventDefault();"
  "var r=svg.getBoundingClientRect();zoom(ev.deltaY<0?0.8:1.25,(ev.clientX-r.left)/r.width,"
  "(ev.clientY-r.top)/r.height);},{passive:false});\n"
  " box.addEventListener('pointerdown',function(ev){drag={x:ev.clientX,y:ev.clientY,vb:vb.slice()};"
  "box.setPointerCapture(ev.pointerId);box.classList.add('grabbing');});\n"
  " box.addEventListener('pointermove',function(ev){if(!drag)return;var r=svg.getBoundingClientRect();"
  "var s=Math.max(vb[2]/r.width,vb[3]/r.height);vb[0]=drag.vb[0]-(ev.clientX-drag.x)*s;"
  "vb[1]=drag.vb[1]-(ev.clientY-drag.y)*s;apply();});\n"
  " box.addEventListener('pointerup',function(){drag=null;box.classList.remove('grabbing');});\n"
  " box.addEventListener('dblclick',reset);\n"
  " fig.querySelectorAll('.zoombar button').forEach(function(b){b.addEventListener('click',function(){"
  "var a=b.getAttribute('data-act');if(a==='in')zoom(0.8,0.5,0.5);else if(a==='out')zoom(1.25,0.5,0.5);"
  "else reset();});});\n"
  " all.push(reset);\n"
  "});\n"
  "window.addEventListener('beforeprint',function(){all.forEach(function(f){f();});});\n"
  "})();\n"
  /* The pass stepper: one step shown at a time (Previous/Next, the arrow
  ** keys, #step=N in the address, which shows that step where the stepper
  ** is, without scrolling the page).  Each step's removed lines are copies
  ** of the previous listing's lines, made when the step is first shown;
  ** without this script every step is a section of its own. */
  "(function(){\n"
  "var steps=[].slice.call(document.querySelectorAll('#steps .step'));if(!steps.length)return;\n"
  "document.documentElement.classList.add('js');\n"
  "var cur=-1,prev=document.querySelector('#steps .st-prev'),next=document.querySelector('#steps .st-next'),"
  "pos=document.querySelector('#steps .st-pos'),links=[].slice.call(document.querySelectorAll('#steps .st-list a'));\n"
  "function pairs(s,k){var v=s.getAttribute(k);return v?v.split(',').map(function(p){return p.split(':').map(Number);}):[];}\n"
  "function build(s){if(s.built)return;s.built=1;var pv=s.getAttribute('data-prev'),pre=s.querySelector('pre.ir');\n"
  " var ref=s.querySelector('[data-ref]');if(ref){var src=document.querySelector('#'+ref.getAttribute('data-ref')+' pre');"
  "if(src){var c=src.cloneNode(true);c.className='code st-code';ref.appendChild(c);}}\n"
  " if(!pv||!pre)return;var old=document.getElementById('ir-'+pv).children,now=[].slice.call(pre.children),last={};\n"
  " pairs(s,'data-was').forEach(function(p){var n=now[p[0]-1],o=old[p[1]-1];if(n&&o)n.title='was: '+o.textContent.trim();});\n"
  " pairs(s,'data-gone').forEach(function(p){var o=old[p[0]-1],at=last[p[1]]||now[p[1]-1];if(!o||!at)return;"
  "var c=o.cloneNode(true);c.className='r';at.parentNode.insertBefore(c,at.nextSibling);last[p[1]]=c;});\n"
  "}\n"
  "function show(i,scroll,init){i=Math.max(0,Math.min(steps.length-1,i));if(i===cur)return;cur=i;build(steps[i]);\n"
  " steps.forEach(function(s,k){s.hidden=k!==i;});links.forEach(function(a,k){a.className=k===i?'on':'';});\n"
  " prev.disabled=i===0;next.disabled=i===steps.length-1;pos.textContent='step '+(i+1)+' of '+steps.length;\n"
  " if(!init&&history.replaceState)history.replaceState(null,'','#step='+(i+1));\n"
  /* after the page is laid out (moving a scroll position while it loads
  ** leaves headless Chromium's picture unpainted): the pane at the
  ** step's first change, the page at the stepper */
  " var s=steps[i];requestAnimationFrame(function(){var pre=s.querySelector('pre.ir'),"
  "m=pre&&pre.querySelector('.a,.c,.r');if(pre)pre.scrollTop=m?Math.max(0,m.offsetTop-pre.offsetTop-60):0;"
  "if(scroll)window.scrollTo(0,document.getElementById('steps').offsetTop);});}\n"
  "function fromHash(){var m=/step[=-](\\d+)/.exec(location.hash);return m?+m[1]-1:-1;}\n"
  "prev.addEventListener('click',function(){show(cur-1);});next.addEventListener('click',function(){show(cur+1);});\n"
  "links.forEach(function(a,k){a.addEventListener('click',function(ev){ev.preventDefault();show(k);});});\n"
  "document.addEventListener('keydown',function(ev){if(ev.altKey||ev.ctrlKey||ev.metaKey)return;"
  "var t=ev.target.tagName;if(t==='INPUT'||t==='TEXTAREA')return;"
  "if(ev.key==='ArrowRight'){show(cur+1);ev.preventDefault();}else if(ev.key==='ArrowLeft'){show(cur-1);ev.preventDefault();}});\n"
  "window.addEventListener('hashchange',function(){var i=fromHash();if(i>=0)show(i,true);});\n"
  "var h=fromHash();show(h>=0?h:0,false,h<0);\n"
  "})();\n";

void viz_report_init(viz_report *r) {
  memset(r, 0, sizeof *r);
  r->cold_ms = r->warm_ms = r->steady_ms = r->eager_ms = -1;
}

static void none(strbuf *b, const char *what) {
  strbuf_printf(b, "<p class=\"none\">%s</p>\n", what);
}

/* a time to read at a glance: small kernels in microseconds */
static void ms_str(double ms, char *buf, size_t n) {
  if (ms < 0) snprintf(buf, n, "\xe2\x80\x94");
  else if (ms < 0.1) snprintf(buf, n, "%.1f \xc2\xb5s", ms * 1e3);
  else if (ms < 1) snprintf(buf, n, "%.3f ms", ms);
  else if (ms < 100) snprintf(buf, n, "%.2f ms", ms);
  else snprintf(buf, n, "%.0f ms", ms);
}

/* Inlines Graphviz SVG: drops the XML prolog and doctype (not allowed
** inside HTML) and the fixed width/height, so CSS sizes the picture and
** the viewBox alone maps it; the natural height sizes the frame. */
static void embed_svg(strbuf *b, const char *svg, const char *label, const char *id) {
  const char *s = svg ? strstr(svg, "<svg") : NULL;
  const char *end, *p;
  double h = 0;
  int px;
  strbuf_printf(b, "<figure class=\"graph\" id=\"%s\"><figcaption><span>", id);
  viz_esc(b, label);
  strbuf_printf(b, "</span><span class=\"zoombar\"><button data-act=\"in\" title=\"zoom in\">+</button>"
                "<button data-act=\"out\" title=\"zoom out\">\xe2\x88\x92</button>"
                "<button data-act=\"reset\" title=\"whole picture\">fit</button></span></figcaption>\n");
  if (!s || !(end = strchr(s, '>'))) {
    none(b, "no picture");
    strbuf_printf(b, "</figure>\n");
    return;
  }
  p = strstr(s, " height=\"");
  if (p && p < end) h = atof(p + 9);
  /* points to CSS pixels; a frame between 180 and 720 pixels tall */
  px = (int)(h * 4.0 / 3.0) + 8;
  if (px < 180) px = 180;
  if (px > 720) px = 720;
  strbuf_printf(b, "<div class=\"zoom\" style=\"height:%dpx\">", px);
  strbuf_printf(b, "<svg");
  p = s + 4;
  while (p < end) {
    /* copy attributes one by one, skipping width= and height= */
    const char *q = p, *eq, *val_end;
    while (q < end && (*q == ' ' || *q == '\n' || *q == '\t')) q++;
    eq = memchr(q, '=', (size_t)(end - q));
    if (!eq || eq[1] != '"' || !(val_end = memchr(eq + 2, '"', (size_t)(end - eq - 2)))) {
      strbuf_printf(b, "%.*s", (int)(end - p), p);
      break;
    }
    if (!((eq - q == 5 && strncmp(q, "width", 5) == 0) ||
          (eq - q == 6 && strncmp(q, "height", 6) == 0)))
      strbuf_printf(b, " %.*s", (int)(val_end + 1 - q), q);
    p = val_end + 1;
  }
  strbuf_printf(b, " preserveAspectRatio=\"xMidYMid meet\"%s", end[-1] == '/' ? "/" : "");
  strbuf_printf(b, "%s</div></figure>\n", end);
}

static void section(strbuf *b, const char *id, const char *title) {
  strbuf_printf(b, "<section id=\"%s\"><h2>%s</h2>\n", id, title);
}

/* a value too long for a card (a sentence): a line under the cards */
#define CARD_MAX 28

static void summary(strbuf *b, const viz_report *r) {
  int i;
  section(b, "summary", "Summary");
  if (!r->nsummary) none(b, "no numbers given");
  else strbuf_printf(b, "<div class=\"cards\">\n");
  for (i = 0; i < r->nsummary; i++) {
    if (strlen(r->summary[i].value) > CARD_MAX) continue;
    strbuf_printf(b, "<div class=\"card\"><div class=\"v\">");
    viz_esc(b, r->summary[i].value);
    strbuf_printf(b, "</div><div class=\"k\">");
    viz_esc(b, r->summary[i].key);
    strbuf_printf(b, "</div></div>\n");
  }
  if (r->nsummary) strbuf_printf(b, "</div>\n");
  for (i = 0; i < r->nsummary; i++) {
    if (strlen(r->summary[i].value) <= CARD_MAX) continue;
    strbuf_printf(b, "<p class=\"note\"><b>");
    viz_esc(b, r->summary[i].key);
    strbuf_printf(b, ":</b> ");
    viz_esc(b, r->summary[i].value);
    strbuf_printf(b, "</p>\n");
  }
  strbuf_printf(b, "</section>\n");
}

/* The memory chart (fl.draw_memory's picture), when the caller made one. */
static void memory(strbuf *b, const viz_report *r) {
  if (!r->memory_svg) return;
  section(b, "memory", "Memory alive at each step");
  embed_svg(b, r->memory_svg, r->memory_label ? r->memory_label : "memory", "memory-chart");
  strbuf_printf(b, "</section>\n");
}

static void graphs(strbuf *b, const viz_report *r) {
  section(b, "graphs", "Graphs before and after fusion");
  if (!r->before_svg && !r->after_svg) none(b, "no graphs given");
  else {
    strbuf_printf(b, "<div class=\"pair\">\n");
    if (r->before_svg) embed_svg(b, r->before_svg, r->before_label ? r->before_label : "before", "graph-before");
    if (r->after_svg) embed_svg(b, r->after_svg, r->after_label ? r->after_label : "after", "graph-after");
    strbuf_printf(b, "</div>\n<p class=\"hint\">Drag to pan \xc2\xb7 Ctrl+wheel or +/\xe2\x88\x92 to zoom "
                  "\xc2\xb7 double-click to see the whole graph.</p>\n");
  }
  strbuf_printf(b, "</section>\n");
}

/* One listing line: escaped, in a span the stepper's script can count
** (the n-th child is line n), classed by what the step did to it and,
** for a reader without the script, whether the next step removes it. */
static void ir_line(strbuf *b, const char *p, size_t len, char mark, int gone_next) {
  const char *cls = mark == VIZ_LINE_ADDED ? "a" : mark == VIZ_LINE_CHANGED ? "c" : NULL;
  char *ln = malloc(len + 1);
  if (!ln) { b->oom = 1; return; }
  memcpy(ln, p, len);
  ln[len] = '\0';
  if (cls && gone_next) strbuf_printf(b, "<span class=\"%s x\">", cls);
  else if (cls || gone_next) strbuf_printf(b, "<span class=\"%s\">", cls ? cls : "x");
  else strbuf_printf(b, "<span>");
  viz_esc(b, ln);
  strbuf_printf(b, "</span>");
  free(ln);
}

/* "a:b,c:d" from n pairs */
static void pairs_attr(strbuf *b, const char *name, const int *v, int n) {
  int i;
  if (!n) return;
  strbuf_printf(b, " %s=\"", name);
  for (i = 0; i < n; i++) strbuf_printf(b, "%s%d:%d", i ? "," : "", v[2 * i], v[2 * i + 1]);
  strbuf_printf(b, "\"");
}

static int count_lines(const char *s) {
  int n = 1;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* The pass stepper (tinygrad's VIZ is the model): capture, each pass,
** fusion, the generated code, one step at a time.  Every step is a
** section of the page, so without the script, or printed, all of them
** read in order; the script shows one and builds its removed lines from
** the previous listing (the page holds each listing once). */
static void stepper(strbuf *b, const viz_report *r) {
  char **gone_next;
  int i, k;
  section(b, "steps", "Pass by pass");
  if (!r->nsteps) {
    none(b, "no stages to step through");
    strbuf_printf(b, "</section>\n");
    return;
  }
  /* the lines each listing loses at the step that follows it */
  gone_next = calloc((size_t)r->nsteps, sizeof *gone_next);
  if (!gone_next) { b->oom = 1; return; }
  for (i = 0; i < r->nsteps; i++) {
    const viz_step *st = &r->steps[i];
    int pv = st->prev, nl;
    if (pv < 0 || pv >= r->nsteps || !r->steps[pv].listing || !st->ngone) continue;
    nl = count_lines(r->steps[pv].listing);
    if (!gone_next[pv] && !(gone_next[pv] = calloc((size_t)nl + 1, 1))) { b->oom = 1; break; }
    for (k = 0; k < st->ngone; k++)
      if (st->gone[2 * k] >= 1 && st->gone[2 * k] <= nl) gone_next[pv][st->gone[2 * k]] = 1;
  }
  strbuf_printf(b, "<div class=\"stepbar\"><button type=\"button\" class=\"st-prev\">\xe2\x97\x80 Previous"
                "</button><span class=\"st-pos\">%d steps</span><button type=\"button\" class=\"st-next\">"
                "Next \xe2\x96\xb6</button><span class=\"st-keys\">or the \xe2\x86\x90 \xe2\x86\x92 keys</span>"
                "</div>\n<ol class=\"st-list\">", r->nsteps);
  for (i = 0; i < r->nsteps; i++) {
    strbuf_printf(b, "<li><a href=\"#step-%d\">%d. ", i + 1, i + 1);
    viz_esc(b, r->steps[i].name);
    strbuf_printf(b, "</a></li>");
  }
  strbuf_printf(b, "</ol>\n<p class=\"legend\"><span class=\"a\">+ added</span><span class=\"c\">~ changed "
                "(same op, new inputs)</span><span class=\"r\">\xe2\x88\x92 removed</span><span class=\"nojs\">"
                "(struck through: removed by the next step)</span></p>\n");
  for (i = 0; i < r->nsteps && !b->oom; i++) {
    const viz_step *st = &r->steps[i];
    strbuf_printf(b, "<div class=\"step\" id=\"step-%d\" data-step=\"%d\" data-name=\"", i + 1, i + 1);
    viz_esc(b, st->name);
    strbuf_printf(b, "\"");
    if (st->added >= 0)
      strbuf_printf(b, " data-added=\"%d\" data-removed=\"%d\" data-changed=\"%d\"", st->added,
                    st->removed, st->changed);
    if (st->prev >= 0 && st->prev < r->nsteps && r->steps[st->prev].listing) {
      strbuf_printf(b, " data-prev=\"%d\"", st->prev + 1);
      pairs_attr(b, "data-gone", st->gone, st->ngone);
      pairs_attr(b, "data-was", st->was, st->nwas);
    }
    strbuf_printf(b, "><h3>%d. ", i + 1);
    viz_esc(b, st->name);
    strbuf_printf(b, "</h3>\n<p class=\"st-sum\">");
    viz_esc(b, st->summary ? st->summary : st->name);
    strbuf_printf(b, "</p>\n");
    if (st->nnotes) {
      strbuf_printf(b, "<ul class=\"st-notes\">");
      for (k = 0; k < st->nnotes; k++) {
        strbuf_printf(b, "<li>");
        viz_esc(b, st->notes[k]);
        strbuf_printf(b, "</li>");
      }
      strbuf_printf(b, "</ul>\n");
    }
    if (st->listing) {
      const char *p = st->listing;
      int line = 1;
      strbuf_printf(b, "<pre class=\"ir\" id=\"ir-%d\">", i + 1);
      for (;;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (!nl && !len) break;   /* no empty line after the last newline */
        ir_line(b, p, len, st->mark && line <= st->nmark ? st->mark[line - 1] : VIZ_LINE_SAME,
                gone_next[i] && gone_next[i][line]);
        line++;
        if (!nl) break;
        p = nl + 1;
      }
      strbuf_printf(b, "</pre>\n");
    } else if (st->ref) {
      strbuf_printf(b, "<div data-ref=\"");
      viz_esc(b, st->ref);
      strbuf_printf(b, "\"><p class=\"nojs\">Shown in the <a href=\"#");
      viz_esc(b, st->ref);
      strbuf_printf(b, "\">section below</a>.</p></div>\n");
    }
    strbuf_printf(b, "</div>\n");
  }
  for (i = 0; i < r->nsteps; i++) free(gone_next[i]);
  free(gone_next);
  strbuf_printf(b, "</section>\n");
}

/* A kernel's GFLOP/s and its share of the roof over its intensity
** (exec/roofline.h's rule), "-" when it was not timed. */
static void roof_cells(strbuf *b, const roof_peaks *pk, const viz_kernel_row *k) {
  roof_kernel rk;
  roof_kernel_of(k->name, k->flops, k->bytes_read + k->bytes_written, k->launch_ms, pk, &rk);
  if (!rk.timed)
    strbuf_printf(b, "<td class=\"n\">-</td><td class=\"n\">-</td>");
  else
    strbuf_printf(b, "<td class=\"n\">%.2f</td><td class=\"n\">%.0f%% (%s)</td>", rk.gflops,
                  rk.roof_pct, rk.flops > 0 ? roof_bound_name(rk.bound) : "copy");
}

static void kernels(strbuf *b, const viz_report *r) {
  char rd[32], wr[32], tot[32], t[32];
  int i, nodes = 0, timed = 0, roof = 0;
  int64_t sr = 0, sw = 0;
  double st = 0;
  section(b, "kernels", "Kernels");
  if (!r->nkernels) {
    none(b, "no kernels");
    strbuf_printf(b, "</section>\n");
    return;
  }
  for (i = 0; i < r->nkernels && r->peaks; i++) roof |= r->kernels[i].launch_ms > 0;
  if (roof)
    strbuf_printf(b, "<p class=\"note\">Roofline: this machine (%s, %d threads) copies at "
                  "%.1f GB/s and multiplies at %.0f GFLOP/s, so a kernel below %.1f flop/byte is "
                  "bound by memory, above it by compute; <i>of roof</i> is its GFLOP/s (GB/s "
                  "when it computes nothing) against the most the machine allows at its "
                  "intensity (<code>fl.draw_roofline</code> draws it).</p>\n",
                  r->peaks->cpu, r->peaks->threads, r->peaks->copy_gbs,
                  r->peaks->product_gflops, roof_ridge(r->peaks));
  strbuf_printf(b, "<table><thead><tr><th class=\"n\">#</th><th>kernel</th><th>kind</th>"
                "<th class=\"n\">nodes</th><th class=\"n\">read</th><th class=\"n\">written</th>"
                "<th class=\"n\">moved</th><th class=\"n\">time</th>%s</tr></thead><tbody>\n",
                roof ? "<th class=\"n\">GFLOP/s</th><th class=\"n\">of roof</th>" : "");
  for (i = 0; i < r->nkernels; i++) {
    const viz_kernel_row *k = &r->kernels[i];
    strbuf_printf(b, "<tr><td class=\"n\">%d</td><td><code>", i);
    viz_esc(b, k->name);
    strbuf_printf(b, "</code></td><td>");
    viz_esc(b, k->kind);
    ms_str(k->time_ms, t, sizeof t);
    strbuf_printf(b, "</td><td class=\"n\">%d</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
                  "<td class=\"n\">%s</td><td class=\"n\">%s</td>", k->nodes,
                  viz_bytes_str(k->bytes_read, rd, sizeof rd),
                  viz_bytes_str(k->bytes_written, wr, sizeof wr),
                  viz_bytes_str(k->bytes_read + k->bytes_written, tot, sizeof tot), t);
    if (roof) roof_cells(b, r->peaks, k);
    strbuf_printf(b, "</tr>\n");
    nodes += k->nodes;
    sr += k->bytes_read;
    sw += k->bytes_written;
    if (k->time_ms >= 0) { st += k->time_ms; timed++; }
  }
  ms_str(timed ? st : -1, t, sizeof t);
  strbuf_printf(b, "<tr class=\"total\"><td></td><td>%d kernels</td><td></td><td class=\"n\">%d</td>"
                "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
                "<td class=\"n\">%s</td>%s</tr>\n</tbody></table>\n</section>\n",
                r->nkernels, nodes, viz_bytes_str(sr, rd, sizeof rd),
                viz_bytes_str(sw, wr, sizeof wr), viz_bytes_str(sr + sw, tot, sizeof tot), t,
                roof ? "<td></td><td></td>" : "");
}

static void decisions(strbuf *b, const viz_report *r) {
  char by[32];
  int i, fused = 0;
  section(b, "decisions", "Fusion decisions");
  if (!r->ndecisions) {
    none(b, "no decisions recorded");
    strbuf_printf(b, "</section>\n");
    return;
  }
  for (i = 0; i < r->ndecisions; i++) fused += r->decisions[i].fused != 0;
  strbuf_printf(b, "<p>%d of %d candidate pairs fused.</p>\n", fused, r->ndecisions);
  strbuf_printf(b, "<table><thead><tr><th>producer</th><th>consumer</th><th>decision</th>"
                "<th>reason</th><th class=\"n\">bytes saved</th></tr></thead><tbody>\n");
  for (i = 0; i < r->ndecisions; i++) {
    const viz_decision_row *d = &r->decisions[i];
    strbuf_printf(b, "<tr><td><code>");
    viz_esc(b, d->a);
    strbuf_printf(b, "</code></td><td><code>");
    viz_esc(b, d->b);
    strbuf_printf(b, "</code></td><td class=\"%s\">%s</td><td>", d->fused ? "yes" : "no",
                  d->fused ? "fused" : "kept apart");
    viz_esc(b, d->reason);
    strbuf_printf(b, "</td><td class=\"n\">%s</td></tr>\n",
                  d->fused ? viz_bytes_str(d->bytes_saved, by, sizeof by) : "\xe2\x80\x94");
  }
  strbuf_printf(b, "</tbody></table>\n</section>\n");
}

static void code(strbuf *b, const viz_report *r) {
  const char *p = r->code;
  int line = 1;
  section(b, "code", "Generated code");
  if (!p || !*p) {
    none(b, "no generated code");
    strbuf_printf(b, "</section>\n");
    return;
  }
  if (r->code_lang) {
    strbuf_printf(b, "<p>");
    viz_esc(b, r->code_lang);
    strbuf_printf(b, " source.</p>\n");
  }
  strbuf_printf(b, "<pre class=\"code\"><code>");
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    char *ln = malloc(len + 1);
    if (!ln) { b->oom = 1; return; }
    memcpy(ln, p, len);
    ln[len] = '\0';
    strbuf_printf(b, "<span class=\"ln\">%d</span>", line++);
    viz_esc(b, ln);
    strbuf_printf(b, "\n");
    free(ln);
    p += len + (nl ? 1 : 0);
  }
  strbuf_printf(b, "</code></pre>\n</section>\n");
}

static void list(strbuf *b, const char *const *items, int n, const char *empty) {
  int i;
  if (!n) {
    none(b, empty);
    return;
  }
  strbuf_printf(b, "<ul class=\"plain\">\n");
  for (i = 0; i < n; i++) {
    strbuf_printf(b, "<li><code>");
    viz_esc(b, items[i]);
    strbuf_printf(b, "</code></li>\n");
  }
  strbuf_printf(b, "</ul>\n");
}

static void guards(strbuf *b, const viz_report *r) {
  section(b, "guards", "Guards and recompilations");
  strbuf_printf(b, "<h3>Guards checked on every call</h3>\n");
  list(b, r->guards, r->nguards, "no guards recorded");
  strbuf_printf(b, "<h3>Recompile reasons</h3>\n");
  list(b, r->recompiles, r->nrecompiles, "no recompilation");
  strbuf_printf(b, "</section>\n");
}

static void breaks(strbuf *b, const viz_report *r) {
  int i;
  section(b, "breaks", "Graph breaks");
  if (!r->nbreaks) {
    none(b, "no graph breaks: the function was captured whole");
    strbuf_printf(b, "</section>\n");
    return;
  }
  strbuf_printf(b, "<table><thead><tr><th class=\"n\">#</th><th>reason</th><th>hint</th>"
                "<th>where</th></tr></thead><tbody>\n");
  for (i = 0; i < r->nbreaks; i++) {
    strbuf_printf(b, "<tr><td class=\"n\">%d</td><td>", i + 1);
    viz_esc(b, r->breaks[i].reason);
    strbuf_printf(b, "</td><td>");
    viz_esc(b, r->breaks[i].hint);
    strbuf_printf(b, "</td><td><code>");
    viz_esc(b, r->breaks[i].where);
    strbuf_printf(b, "</code></td></tr>\n");
  }
  strbuf_printf(b, "</tbody></table>\n</section>\n");
}

static void timings(strbuf *b, const viz_report *r) {
  static const char *names[] = {"cold (first call: capture + compile + run)",
                                "second call", "steady state (median call)",
                                "eager (uncompiled)"};
  static const char *cls[] = {"cold", "", "", "eager"};
  double v[4], mx = 0;
  char t[32];
  int i, any = 0;
  v[0] = r->cold_ms; v[1] = r->warm_ms; v[2] = r->steady_ms; v[3] = r->eager_ms;
  section(b, "timings", "Timings");
  for (i = 0; i < 4; i++) {
    if (v[i] >= 0) any = 1;
    if (v[i] > mx) mx = v[i];
  }
  if (!any) {
    none(b, "not measured");
    strbuf_printf(b, "</section>\n");
    return;
  }
  strbuf_printf(b, "<table><tbody>\n");
  for (i = 0; i < 4; i++) {
    ms_str(v[i], t, sizeof t);
    strbuf_printf(b, "<tr><td style=\"width:34%%\">");
    viz_esc(b, i == 0 && r->cold_label ? r->cold_label : names[i]);
    strbuf_printf(b, "</td><td class=\"n\" style=\"width:12%%\">%s</td><td>", t);
    if (v[i] >= 0 && mx > 0)
      strbuf_printf(b, "<div class=\"bar %s\" style=\"width:%.1f%%\"></div>",
                    i == 0 && r->cold_label && !strstr(r->cold_label, "cold") ? "" : cls[i],
                    100.0 * v[i] / mx);
    if (r->timing_notes[i]) {
      strbuf_printf(b, "<div class=\"note\">");
      viz_esc(b, r->timing_notes[i]);
      strbuf_printf(b, "</div>");
    }
    strbuf_printf(b, "</td></tr>\n");
  }
  strbuf_printf(b, "</tbody></table>\n");
  if (r->verdict || r->break_even) {
    /* the caller decided with a margin above the noise, and gives the
    ** page's only break-even number */
    strbuf_printf(b, "<p>");
    if (r->verdict) viz_esc(b, r->verdict);
    if (r->verdict && r->break_even) strbuf_printf(b, " ");
    if (r->break_even) viz_esc(b, r->break_even);
    strbuf_printf(b, "</p>\n");
  } else if (r->steady_ms > 0 && r->eager_ms > 0) {
    strbuf_printf(b, "<p>Steady state runs at <b>%.2f\xc3\x97</b> the speed of eager.", r->eager_ms / r->steady_ms);
    if (r->cold_ms >= 0 && r->eager_ms > r->steady_ms) {
      /* the first call costs cold - eager extra; each later call saves
      ** eager - steady */
      double extra = r->cold_ms - r->eager_ms, gain = r->eager_ms - r->steady_ms;
      double calls = extra <= 0 ? 1 : 1 + ceil(extra / gain);
      strbuf_printf(b, " Compilation pays for itself after <b>%.0f</b> call%s.", calls,
                    calls == 1 ? "" : "s");
    } else if (r->eager_ms <= r->steady_ms) {
      strbuf_printf(b, " Compiled calls are not faster than eager ones: compilation never pays off here.");
    }
    strbuf_printf(b, "</p>\n");
  }
  strbuf_printf(b, "</section>\n");
}

static void checklist(strbuf *b, const viz_report *r) {
  static const char *mark[] = {"\xe2\x9a\xa0", "\xe2\x80\xa2", "\xe2\x9c\x93"};  /* ⚠ • ✓ */
  int i;
  if (!r->nchecklist && !r->recommendation) return;
  section(b, "checklist", "Go-live checklist");
  if (r->nchecklist) {
    strbuf_printf(b, "<table><thead><tr><th></th><th>check</th><th>measured</th></tr></thead><tbody>\n");
    for (i = 0; i < r->nchecklist; i++) {
      int v = r->checklist[i].verdict;
      v = v > 0 ? 1 : v < 0 ? -1 : 0;
      strbuf_printf(b, "<tr><td class=\"verdict v%d\">%s</td><td>", v, mark[v + 1]);
      viz_esc(b, r->checklist[i].item);
      strbuf_printf(b, "</td><td>");
      viz_esc(b, r->checklist[i].value);
      strbuf_printf(b, "</td></tr>\n");
    }
    strbuf_printf(b, "</tbody></table>\n");
  }
  if (r->recommendation) {
    strbuf_printf(b, "<div class=\"reco\"><b>Recommendation:</b> ");
    viz_esc(b, r->recommendation);
    strbuf_printf(b, "</div>\n");
  }
  strbuf_printf(b, "</section>\n");
}

char *viz_report_html(const viz_report *r, fl_err *e) {
  strbuf b = {0};
  char *out;
  if (!r || !r->title) {
    err_set(e, FL_EINVAL, "report: a title is required");
    return NULL;
  }
  strbuf_printf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                "<meta name=\"generator\" content=\"fuselab\">\n<title>");
  viz_esc(&b, r->title);
  strbuf_printf(&b, "</title>\n<style>\n%s</style>\n</head><body>\n<header><div class=\"in\"><h1>", css);
  viz_esc(&b, r->title);
  strbuf_printf(&b, "</h1>");
  if (r->subtitle) {
    strbuf_printf(&b, "<p class=\"sub\">");
    viz_esc(&b, r->subtitle);
    strbuf_printf(&b, "</p>");
  }
  strbuf_printf(&b, "\n<nav><a href=\"#summary\">summary</a>%s<a href=\"#graphs\">graphs</a>"
                "%s<a href=\"#kernels\">kernels</a><a href=\"#decisions\">decisions</a>"
                "<a href=\"#code\">code</a><a href=\"#guards\">guards</a><a href=\"#breaks\">breaks</a>"
                "<a href=\"#timings\">timings</a>%s</nav></div></header>\n<main>\n",
                r->nsteps ? "<a href=\"#steps\">pass by pass</a>" : "",
                r->memory_svg ? "<a href=\"#memory\">memory</a>" : "",
                r->nchecklist || r->recommendation ? "<a href=\"#checklist\">checklist</a>" : "");
  summary(&b, r);
  if (r->nsteps) stepper(&b, r);
  graphs(&b, r);
  memory(&b, r);
  kernels(&b, r);
  decisions(&b, r);
  code(&b, r);
  guards(&b, r);
  breaks(&b, r);
  timings(&b, r);
  checklist(&b, r);
  strbuf_printf(&b, "<footer>Written by fuselab. This file is self-contained: it loads nothing "
                "from anywhere.</footer>\n</main>\n<script>\n%s</script>\n</body></html>\n", js);
  out = strbuf_take(&b);
  if (!out) err_set(e, FL_ENOMEM, "report: out of memory");
  return out;
}

/* The page replaces path atomically (file_create): a reader of the old
** report never sees half of the new one. */
int viz_report_write(const viz_report *r, const char *path, fl_err *e) {
  char *html;
  file_out w;
  int rc;
  if (!path || !path[0]) return err_set(e, FL_EINVAL, "report: no file name given");
  html = viz_report_html(r, e);
  if (!html) return e ? e->code : FL_ENOMEM;
  if ((rc = file_create(&w, path, e)) == FL_OK) {
    if ((rc = file_write(&w, html, strlen(html), e)) == FL_OK) rc = file_commit(&w, e);
    else file_abort(&w);
  }
  free(html);
  return rc == FL_OK ? FL_OK : err_prefix(e, "report");
}

int viz_stage_svg(const viz_stage *st, const viz_opts *o, char **svg, fl_err *e) {
  viz_scene s;
  size_t len;
  memset(&s, 0, sizeof s);
  s.stages = st;
  s.nstages = 1;
  return viz_render_mem(&s, "svg", o, svg, &len, e);
}
