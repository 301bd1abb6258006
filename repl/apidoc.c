/*
** apidoc.c -- `:help NAME` and `? NAME`: the entry of doc/API.md that
** documents a function, method, field or module.
**
** doc/API.md is compiled into the binary (repl/api_md.h, made from it by
** make), so an installed REPL has the same text as the source tree and
** it never goes stale.  An entry is a heading (##, ### or ####) and the
** text up to the next heading.  The names an entry documents come from the
** backquoted spans of its heading: the leading path of each span
** (`fl.zeros(size...)` names fl.zeros, `x:to(d)` names x:to), or every
** word of a span that is only words (`abs neg exp ...`).  A name is found
** by its whole path first, then by its last part (`zeros`, `fl.exp` and
** `x:exp` all find the entry of the unary functions), then among the
** paths quoted in entries' text (`p:decisions()`); else the nearest names
** are offered.
*/
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repl/repl.h"
#include "repl/api_md.h"

#define NAME_MAX_LEN 48
#define SHOW_MAX_LINES 60   /* of one entry; the rest is in doc/API.md */
#define MAX_SHOWN 4         /* entries shown for a name found in several */

struct entry {
  const char *head, *body, *end;  /* "#### ...", its text, where it ends */
  int line;                       /* of the heading in doc/API.md */
};

struct name {
  char path[NAME_MAX_LEN];   /* fl.zeros, x:to, abs */
  int last;                  /* where its last part starts in path (an
                             ** offset: the array moves as it grows) */
  int entry;
  int mentioned;             /* quoted in the text, not the heading */
};

static struct entry *entries;
static int nentries;
static struct name *names;
static int nnames, capnames;
static const char **name_list;  /* for completion; NULL-terminated */

static int word_char(int c) { return isalnum(c) || c == '_'; }

static void add_name(const char *s, size_t n, int entry, int mentioned) {
  struct name *v;
  const char *p;
  int i;
  if (n == 0 || n >= NAME_MAX_LEN || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return;
  for (i = 0; i < nnames; i++)  /* once per entry */
    if (names[i].entry == entry && strlen(names[i].path) == n && memcmp(names[i].path, s, n) == 0)
      return;
  if (nnames == capnames) {
    int cap = capnames ? 2 * capnames : 256;
    if ((v = realloc(names, (size_t)cap * sizeof *v)) == NULL) return;
    names = v;
    capnames = cap;
  }
  v = &names[nnames++];
  memcpy(v->path, s, n);
  v->path[n] = '\0';
  v->last = 0;
  for (p = v->path; *p; p++)
    if ((*p == '.' || *p == ':') && p[1]) v->last = (int)(p + 1 - v->path);
  v->entry = entry;
  v->mentioned = mentioned;
}

/* The leading path of a span: a.b:c, or x[i] (indexing has an entry). */
static size_t path_len(const char *s, const char *end) {
  const char *p = s;
  while (p < end && (word_char((unsigned char)*p) ||
                     ((*p == '.' || *p == ':') && p + 1 < end && isalpha((unsigned char)p[1]))))
    p++;
  if (p + 2 < end && p[0] == '[' && p[1] == 'i' && p[2] == ']') p += 3;
  return (size_t)(p - s);
}

/* The names in the backquoted spans of text (one heading line, or an
** entry's body when mentioned: then only calls of a dotted path). */
static void spans(const char *s, const char *end, int entry, int mentioned) {
  while (s < end && (s = memchr(s, '`', (size_t)(end - s))) != NULL) {
    const char *a = s + 1, *b = memchr(a, '`', (size_t)(end - a)), *p;
    int words = 1;
    if (b == NULL || b < a) break;
    for (p = a; p < b; p++)
      if (!(islower((unsigned char)*p) || *p == '_' || *p == ' ' || isdigit((unsigned char)*p))) words = 0;
    if (words && !mentioned && memchr(a, ' ', (size_t)(b - a))) {
      for (p = a; p < b;) {
        const char *q = p;
        while (q < b && *q != ' ') q++;
        add_name(p, (size_t)(q - p), entry, 0);
        p = q + 1;
      }
    }
    else {
      size_t n = path_len(a, b);
      if (!mentioned) add_name(a, n, entry, 0);
      else if ((a + n < b && a[n] == '(' && (memchr(a, '.', n) || memchr(a, ':', n))) ||
               (a + n == b && memchr(a, '.', n)))   /* `p:decisions()`, `fl.version` */
        add_name(a, n, entry, 1);
    }
    s = b + 1;
  }
}

static void parse(void) {
  const char *s = (const char *)api_md, *end = s + sizeof api_md, *p;
  int line = 1, cap = 0, i;
  if (entries != NULL || names != NULL) return;
  for (p = s; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *eol = nl ? nl : end;
    if (*p == '#') {
      if (nentries > 0 && entries[nentries - 1].end == NULL) entries[nentries - 1].end = p;
      if (eol - p > 3 && p[1] == '#') {  /* ##, ### and ####; not the title */
        if (nentries == cap) {
          struct entry *v;
          cap = cap ? 2 * cap : 128;
          if ((v = realloc(entries, (size_t)cap * sizeof *v)) == NULL) return;
          entries = v;
        }
        entries[nentries].head = p;
        entries[nentries].body = nl ? nl + 1 : end;
        entries[nentries].end = NULL;
        entries[nentries].line = line;
        spans(p, eol, nentries, 0);
        nentries++;
      }
    }
    line++;
    p = nl ? nl + 1 : end;
  }
  if (nentries > 0 && entries[nentries - 1].end == NULL) entries[nentries - 1].end = end;
  for (i = 0; i < nentries; i++) spans(entries[i].body, entries[i].end, i, 1);
}

/* Prints one entry: the heading without its marks, then the text, the
** fences of its examples turned into words. */
static void show(int e) {
  const struct entry *en = &entries[e];
  const char *p = en->head + strspn(en->head, "# "), *nl = memchr(p, '\n', (size_t)(en->end - p));
  int lines = 0, blank = 0;
  printf("%.*s    (doc/API.md:%d)\n", (int)((nl ? nl : en->end) - p), p, en->line);
  for (p = nl ? nl + 1 : en->end; p < en->end;) {
    const char *eol = memchr(p, '\n', (size_t)(en->end - p));
    size_t n = (size_t)((eol ? eol : en->end) - p);
    if (n == 0) { blank = 1; p = eol ? eol + 1 : en->end; continue; }
    if (lines >= SHOW_MAX_LINES) {
      printf("  ... (the rest: doc/API.md, line %d)\n", en->line);
      break;
    }
    if (blank && lines > 0) { putchar('\n'); lines++; }
    blank = 0;
    if (n >= 3 && strncmp(p, "```", 3) == 0) {
      if (n > 3 && strncmp(p + 3, "lua", n - 3) == 0) puts("  example:");
      else if (n > 3 && strncmp(p + 3, "output", n - 3) == 0) puts("  prints:");
    }
    else printf("  %.*s\n", (int)n, p);
    lines++;
    p = eol ? eol + 1 : en->end;
  }
}

/* Shows the entries whose names pass the test; returns how many there were. */
static int show_matching(const char *q, int by_last, int mentioned) {
  int i, j, shown = 0, found = 0, seen[MAX_SHOWN];
  const char *ql = q, *p;
  for (p = q; *p; p++)
    if ((*p == '.' || *p == ':') && p[1]) ql = p + 1;
  for (i = 0; i < nnames; i++) {
    const struct name *nm = &names[i];
    int dup = 0;
    if (nm->mentioned != mentioned) continue;
    if (by_last ? strcmp(nm->path + nm->last, ql) != 0 : strcmp(nm->path, q) != 0) continue;
    for (j = 0; j < shown; j++) dup |= seen[j] == nm->entry;
    if (dup) continue;
    found++;
    if (shown == MAX_SHOWN) continue;
    if (shown > 0) putchar('\n');
    seen[shown++] = nm->entry;
    show(nm->entry);
  }
  if (found > shown) printf("\n(%d more entries name '%s': search doc/API.md)\n", found - shown, ql);
  return found;
}

int repl_apidoc(const char *name) {
  parse();
  if (*name == '\0') return 0;
  if (show_matching(name, 0, 0)) return 1;
  if (show_matching(name, 1, 0)) return 1;
  if (show_matching(name, 0, 1)) return 1;
  return show_matching(name, 1, 1) > 0;
}

void repl_apidoc_suggest(const char *name) {
  const char *ql = name, *p;
  int best[5], bd[5], nb = 0, i, j, k, limit;
  parse();
  for (p = name; *p; p++)
    if ((*p == '.' || *p == ':') && p[1]) ql = p + 1;
  limit = (int)strlen(ql) / 3 + 1;
  if (limit > 3) limit = 3;
  for (i = 0; i < nnames; i++) {
    const char *last = names[i].path + names[i].last;
    int dd = repl_distance(ql, last) / 2, dup = 0;  /* whole edits */
    if (strstr(last, ql) != NULL && strlen(ql) >= 3) dd = dd < limit ? dd : limit;
    if (dd > limit) continue;
    for (j = 0; j < nb; j++)
      if (strcmp(names[best[j]].path, names[i].path) == 0) dup = 1;
    if (dup) continue;
    for (j = nb; j > 0 && bd[j - 1] > dd; j--) {}
    if (j >= 5) continue;
    for (k = nb < 5 ? nb : 4; k > j; k--) { best[k] = best[k - 1]; bd[k] = bd[k - 1]; }
    best[j] = i;
    bd[j] = dd;
    if (nb < 5) nb++;
  }
  if (nb == 0) return;
  printf("nearest:");
  for (i = 0; i < nb; i++) printf(" %s", names[best[i]].path);
  putchar('\n');
}

const char *const *repl_apidoc_names(void) {
  int i, j, n = 0;
  parse();
  if (name_list != NULL) return name_list;
  if ((name_list = malloc((size_t)(nnames + 1) * sizeof *name_list)) == NULL) return NULL;
  for (i = 0; i < nnames; i++) {
    int dup = names[i].mentioned;
    for (j = 0; j < n && !dup; j++) dup = strcmp(name_list[j], names[i].path) == 0;
    if (!dup) name_list[n++] = names[i].path;
  }
  name_list[n] = NULL;
  return name_list;
}
