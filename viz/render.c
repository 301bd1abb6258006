/*
** render.c -- from a scene to bytes: builds the cgraph picture, lays it out
** with dot through gvc and renders it in the format asked for.  Graphviz
** reports problems through a callback; this file captures them so they
** reach the error record instead of stderr.  Files are opened here, not by
** Graphviz, whose own open failure would end the process.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <graphviz/gvc.h>

#include "graph/file.h"
#include "viz/draw_impl.h"

#define FORMATS ".dot .svg .png .pdf"

/* LeakSanitizer asks for this at start-up in sanitizer builds (and no one
** calls it otherwise).  Graphviz 2.43's dot layout leaks its HTML-label
** parses and cluster skeleton edges, and its text layout caches fonts in
** glib, fontconfig and pango for good: none of it is ours to free, and
** without this every program that draws would fail its leak check.  Our
** own allocations never have these libraries on their stack.  The
** cluster skeletons dot's layout leaks are allocated in libcgraph and
** libcdt, which have no frame pointers: LeakSanitizer's fast unwinding
** stops there and never reaches libgvc (with full unwinding the same
** leak is libgvc's), so those two are listed as well.  Weak, so a
** program may bring its own list. */
__attribute__((weak)) const char *__lsan_default_suppressions(void);
__attribute__((weak)) const char *__lsan_default_suppressions(void) {
  return "leak:libgvc.so\n"
         "leak:libcgraph.so\n"
         "leak:libcdt.so\n"
         "leak:libgvplugin_\n"
         "leak:libglib-2.0.so\n"
         "leak:libgobject-2.0.so\n"
         "leak:libfontconfig.so\n"
         "leak:libpango\n"
         "leak:libcairo.so\n"
         "leak:libharfbuzz.so\n"
         "leak:libfreetype.so\n";
}

static const char *const formats[] = {"dot", "svg", "png", "pdf"};

const char *viz_format_of(const char *path) {
  const char *dot, *slash;
  size_t i;
  if (!path) return NULL;
  dot = strrchr(path, '.');
  slash = strrchr(path, '/');
  if (!dot || (slash && dot < slash)) return NULL;
  for (i = 0; i < sizeof formats / sizeof formats[0]; i++)
    if (strcasecmp(dot + 1, formats[i]) == 0) return formats[i];
  return NULL;
}

static int known_format(const char *f) {
  size_t i;
  for (i = 0; f && i < sizeof formats / sizeof formats[0]; i++)
    if (strcmp(f, formats[i]) == 0) return 1;
  return 0;
}

/* Graphviz's messages of the call in progress (its error callback has no
** user pointer, hence a file-level buffer). */
static char gv_msg[512];

static int gv_errf(char *msg) {
  size_t have = strlen(gv_msg), n = strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) n--;
  if (have + n + 3 < sizeof gv_msg)
    snprintf(gv_msg + have, sizeof gv_msg - have, "%s%.*s", have ? "; " : "", (int)n, msg);
  return 0;
}

/* Most pixels a PNG gets: rasterizing costs about a second per 7
** megapixels here, and beyond this a picture is read in SVG or PDF anyway.
** Cairo also refuses sides over 32767 pixels. */
#define PNG_MAX_PIXELS 8e6
#define PNG_MAX_SIDE 32000.0
/* Cairo's PNG resolution.  Never set through the "dpi" attribute: dot
** then lays out in pixels and draws cluster frames that miss their last
** rank. */
#define PNG_DPI 96.0
#define PROJECTOR_PX 1920.0

/* After a layout: when the PNG would exceed the limits above, sets
** "size" so the drawing is scaled down to fit them and returns 1 (the
** caller lays out again: dot reads size during layout). */
static int png_fit(Agraph_t *G) {
  const char *bb = agget(G, "bb");
  double x0, y0, x1, y1, w, h, s;
  char size[64];
  /* gvLayout writes "llx lly urx ury" in points; the DOT writer uses commas */
  if (!bb || (sscanf(bb, "%lf %lf %lf %lf", &x0, &y0, &x1, &y1) != 4 &&
              sscanf(bb, "%lf,%lf,%lf,%lf", &x0, &y0, &x1, &y1) != 4))
    return 0;
  w = (x1 - x0) / 72.0 * PNG_DPI;
  h = (y1 - y0) / 72.0 * PNG_DPI;
  if (w <= 0 || h <= 0) return 0;
  s = 1.0;
  if (w * h > PNG_MAX_PIXELS) s = sqrt(PNG_MAX_PIXELS / (w * h));
  /* never narrower than a projector's 1920 pixels for the sake of the
  ** pixel budget: a tall picture shown full width keeps its type size */
  if (s < 1.0 && w * s < PROJECTOR_PX) s = w > PROJECTOR_PX ? PROJECTOR_PX / w : 1.0;
  if (w * s > PNG_MAX_SIDE) s = PNG_MAX_SIDE / w;
  if (h * s > PNG_MAX_SIDE) s = PNG_MAX_SIDE / h;
  if (s >= 1.0) return 0;
  snprintf(size, sizeof size, "%.2f,%.2f", w * s / PNG_DPI, h * s / PNG_DPI);
  agsafeset(G, "size", size, "");
  return 1;
}

/* The Graphviz context, made at first use and kept for the process.  A
** context loads the plugins when made, the text layout among them; after
** one is freed, a new one measures text with rough estimates while the
** renderer still draws with the real fonts, so frames and boxes no longer
** fit what is drawn in them. */
static GVC_t *context(void) {
  static GVC_t *gvc;
  if (!gvc) gvc = gvContext();
  return gvc;
}

/* ---- deterministic object ids -------------------------------------------
** cgraph's default discipline makes a named object's id the address of
** its interned name, and dot visits subgraphs in id order: the order of
** clusters, and with it the whole layout, would change with the state of
** the heap from one call to the next.  This discipline numbers names in
** the order they are first seen (even ids; odd ones stay for anonymous
** objects, as in cgraph's own), so the same scene always gives the same
** picture. */

typedef struct idmap {
  char **names;            /* names[k] has id 2k+2 */
  int n, cap;
  int *slot;               /* hash of names: index into names, -1 empty */
  int nslot;               /* a power of two, at least 2n */
  IDTYPE anon;             /* next anonymous id (odd) */
} idmap;

static unsigned long hash_str(const char *s) {
  unsigned long h = 5381;
  while (*s) h = h * 33 + (unsigned char)*s++;
  return h;
}

static void *id_open(Agraph_t *g, Agdisc_t *disc) {
  idmap *m = calloc(1, sizeof *m);
  (void)g;
  (void)disc;
  if (m) m->anon = 1;
  return m;
}

/* slot index of str, or of the empty slot where it would go */
static int id_find(const idmap *m, const char *str) {
  unsigned long i = hash_str(str) & (unsigned long)(m->nslot - 1);
  while (m->slot[i] >= 0 && strcmp(m->names[m->slot[i]], str) != 0)
    i = (i + 1) & (unsigned long)(m->nslot - 1);
  return (int)i;
}

static int id_grow(idmap *m) {
  int ns = m->nslot ? m->nslot * 2 : 256, i;
  int *slot = malloc((size_t)ns * sizeof *slot);
  int *old = m->slot;
  if (!slot) return 0;
  for (i = 0; i < ns; i++) slot[i] = -1;
  m->slot = slot;
  m->nslot = ns;
  for (i = 0; i < m->n; i++) m->slot[id_find(m, m->names[i])] = i;
  free(old);
  return 1;
}

static long id_map(void *state, int objtype, char *str, IDTYPE *id, int createflag) {
  idmap *m = state;
  int at;
  char *copy;
  (void)objtype;
  if (!m) return 0;
  if (!str) {
    *id = m->anon;
    m->anon += 2;
    return 1;
  }
  if (!m->nslot && !id_grow(m)) return 0;
  at = id_find(m, str);
  if (m->slot[at] >= 0) {
    *id = (IDTYPE)(2 * m->slot[at] + 2);
    return 1;
  }
  if (!createflag) return 0;
  if (2 * (m->n + 1) > m->nslot) {
    if (!id_grow(m)) return 0;
    at = id_find(m, str);
  }
  if (m->n == m->cap) {
    int cap = m->cap ? m->cap * 2 : 128;
    char **nn = realloc(m->names, (size_t)cap * sizeof *nn);
    if (!nn) return 0;
    m->names = nn;
    m->cap = cap;
  }
  /* a cgraph string (refstr), not a plain copy: agwrite looks at the
  ** header in front of a name to tell HTML labels from plain ones */
  copy = agstrdup(NULL, str);
  if (!copy) return 0;
  m->names[m->n] = copy;
  m->slot[at] = m->n;
  *id = (IDTYPE)(2 * m->n + 2);
  m->n++;
  return 1;
}

static long id_alloc(void *state, int objtype, IDTYPE id) {
  (void)state;
  (void)objtype;
  (void)id;
  return 1;
}

static void id_free(void *state, int objtype, IDTYPE id) {
  (void)state;
  (void)objtype;
  (void)id;
}

static char *id_print(void *state, int objtype, IDTYPE id) {
  idmap *m = state;
  (void)objtype;
  if (!m || id % 2 || id < 2 || (id - 2) / 2 >= (IDTYPE)m->n) return NULL;
  return m->names[(id - 2) / 2];
}

static void id_close(void *state) {
  idmap *m = state;
  int i;
  if (!m) return;
  for (i = 0; i < m->n; i++) agstrfree(NULL, m->names[i]);
  free(m->names);
  free(m->slot);
  free(m);
}

static void id_register(void *state, int objtype, void *obj) {
  (void)state;
  (void)objtype;
  (void)obj;
}

static Agiddisc_t id_disc = {id_open, id_map, id_alloc, id_free, id_print, id_close, id_register};

/* cgraph's memory and I/O, our ids */
static Agdisc_t *disc(void) {
  static Agdisc_t d;
  d.mem = &AgMemDisc;
  d.id = &id_disc;
  d.io = &AgIoDisc;
  return &d;
}

/* G as read back from its own DOT text.  Dot's cluster placement depends
** on the order nodes were created in: built node by node in id order, a
** node listed in a cluster can end up drawn outside that cluster's frame;
** read from the text, where each cluster lists its members together, it
** does not.  NULL when out of memory. */
static Agraph_t *reread(Agraph_t *G) {
  char *text = NULL;
  size_t n = 0;
  FILE *ms = open_memstream(&text, &n);
  Agraph_t *R = NULL;
  if (!ms) return NULL;
  if (agwrite(G, ms) == 0 && fclose(ms) == 0) {
    FILE *in = fmemopen(text, n, "r");
    if (in) {
      R = agread(in, disc());
      fclose(in);
    }
  } else {
    fclose(ms);
  }
  free(text);
  return R;
}

/* Lays G out and renders it into *out (malloc'd, NUL-terminated). */
static int emit(Agraph_t *G, const char *format, char **out, size_t *len, fl_err *e) {
  char *buf = NULL;
  size_t blen = 0;
  FILE *ms = open_memstream(&buf, &blen);
  int rc = FL_OK;
  if (!ms) return err_set(e, FL_ENOMEM, "draw: out of memory for the picture");
  if (strcmp(format, "dot") == 0) {
    /* the source graph as built: no layout needed, and it re-reads */
    if (agwrite(G, ms) != 0)
      rc = err_set(e, FL_ENOMEM, "draw: could not write DOT text");
  } else if (!(G = reread(G))) {
    rc = err_set(e, FL_ENOMEM, "draw: out of memory laying the picture out");
  } else {
    GVC_t *gvc = context();
    if (!gvc) {
      rc = err_set(e, FL_ENOMEM, "draw: could not start Graphviz");
    } else {
      int laid = gvLayout(gvc, G, "dot") == 0;
      if (laid && strcmp(format, "png") == 0 && png_fit(G)) {
        gvFreeLayout(gvc, G);
        laid = gvLayout(gvc, G, "dot") == 0;
      }
      if (!laid) {
        rc = err_set(e, FL_EUNSUPPORTED, "draw: Graphviz dot layout failed: %s",
                     gv_msg[0] ? gv_msg : "no message (is the dot layout plugin installed?)");
      } else {
        if (gvRender(gvc, G, format, ms) != 0)
          rc = err_set(e, FL_EUNSUPPORTED, "draw: Graphviz cannot render %s here: %s", format,
                       gv_msg[0] ? gv_msg : "no renderer plugin for it");
        gvFreeLayout(gvc, G);
      }
    }
    agclose(G);
  }
  if (fclose(ms) != 0 && rc == FL_OK)
    rc = err_set(e, FL_ENOMEM, "draw: out of memory for the picture");
  if (rc != FL_OK) {
    free(buf);
    return rc;
  }
  *out = buf;
  *len = blen;
  return FL_OK;
}

int viz_render_mem(const viz_scene *s, const char *format, const viz_opts *o,
                   char **out, size_t *len, fl_err *e) {
  viz_opts def;
  viz_view *views;
  viz_builder b;
  agusererrf prev_f;
  agerrlevel_t prev_l;
  int i, rc = FL_OK, max_nodes;
  *out = NULL;
  *len = 0;
  if (!known_format(format))
    return err_set(e, FL_EINVAL, "draw: unknown picture format \"%s\" (formats: %s)",
                   format ? format : "(none)", FORMATS);
  if (!s || s->nstages < 1 || !s->stages)
    return err_set(e, FL_EINVAL, "draw: nothing to draw (no stage given)");
  if (!o) {
    viz_opts_init(&def);
    o = &def;
  }
  if ((o->focus_kernel || o->focus_around >= 0 || o->focus_block >= 0) && s->nstages != 1)
    return err_set(e, FL_EINVAL, "draw: kernel=, around= and block= draw a piece of one graph, "
                   "and this picture has %d", s->nstages);
  if (o->rankdir && strcmp(o->rankdir, "TB") != 0 && strcmp(o->rankdir, "LR") != 0)
    return err_set(e, FL_EINVAL, "draw: rankdir \"%s\" (expected \"TB\" or \"LR\")", o->rankdir);
  max_nodes = o->max_nodes == 0 ? VIZ_DEFAULT_MAX_NODES : o->max_nodes;
  views = calloc((size_t)s->nstages, sizeof *views);
  if (!views) return err_set(e, FL_ENOMEM, "draw: out of memory");
  for (i = 0; i < s->nstages && rc == FL_OK; i++)
    rc = viz_view_init(&views[i], &s->stages[i], i, s->nstages > 1, max_nodes, o, e);
  if (rc == FL_OK) {
    gv_msg[0] = '\0';
    prev_f = agseterrf(gv_errf);
    prev_l = agseterr(AGERR);
    memset(&b, 0, sizeof b);
    b.G = agopen("fuselab", Agdirected, disc());
    b.o = o;
    b.max_nodes = max_nodes;
    b.e = e;
    if (!b.G) rc = err_set(e, FL_ENOMEM, "draw: could not create a Graphviz graph");
    else rc = viz_build_scene(&b, s, views);
    if (rc == FL_OK) rc = emit(b.G, format, out, len, e);
    if (b.G) agclose(b.G);
    strbuf_free(&b.tmp);
    agseterrf(prev_f);
    agseterr(prev_l);
  }
  for (i = 0; i < s->nstages; i++) viz_view_free(&views[i]);
  free(views);
  return rc;
}

int viz_render_file(const viz_scene *s, const char *path, const viz_opts *o,
                    fl_err *e) {
  const char *fmt = viz_format_of(path);
  const char *ext;
  char *data = NULL;
  size_t len = 0;
  file_out w;
  int rc;
  if (!path || !path[0]) return err_set(e, FL_EINVAL, "draw: no file name given");
  if (!fmt) {
    ext = strrchr(path, '.');
    if (ext && strchr(ext, '/')) ext = NULL;
    return err_set(e, FL_EINVAL, "draw: \"%s\": unknown picture format %s%s%s (formats: %s)",
                   path, ext ? "\"" : "", ext ? ext : "(no extension)", ext ? "\"" : "", FORMATS);
  }
  /* create first: a bad path fails at once, before a long layout */
  if (file_create(&w, path, e) != FL_OK) return err_prefix(e, "draw");
  if ((rc = viz_render_mem(s, fmt, o, &data, &len, e)) != FL_OK) {
    file_abort(&w);
    free(data);
    return rc;
  }
  /* the picture replaces path atomically: a viewer never shows half */
  if ((rc = file_write(&w, data, len, e)) == FL_OK) rc = file_commit(&w, e);
  else file_abort(&w);
  free(data);
  return rc == FL_OK ? FL_OK : err_prefix(e, "draw");
}

int viz_draw_stage(const viz_stage *st, const char *path, const viz_opts *o,
                   fl_err *e) {
  viz_scene s;
  memset(&s, 0, sizeof s);
  s.stages = st;
  s.nstages = 1;
  return viz_render_file(&s, path, o, e);
}

int viz_draw_graph(const ir_graph *g, const char *path, const viz_opts *o,
                   fl_err *e) {
  viz_stage st;
  memset(&st, 0, sizeof st);
  st.g = g;
  return viz_draw_stage(&st, path, o, e);
}

int viz_draw_compare(const viz_stage *before, const viz_stage *after,
                     const char *path, const viz_opts *o, fl_err *e) {
  viz_stage two[2];
  viz_scene s;
  if (!before || !after) return err_set(e, FL_EINVAL, "draw_compare: two stages are needed");
  two[0] = *before;
  two[1] = *after;
  memset(&s, 0, sizeof s);
  s.stages = two;
  s.nstages = 2;
  s.compare = 1;
  return viz_render_file(&s, path, o, e);
}

int viz_draw_pieces(const viz_stage *pieces, int n, const viz_break *breaks,
                    const char *path, const viz_opts *o, fl_err *e) {
  viz_scene s;
  memset(&s, 0, sizeof s);
  s.stages = pieces;
  s.nstages = n;
  s.breaks = breaks;
  return viz_render_file(&s, path, o, e);
}
