/*
** loop.c -- the read-eval-print loop.
**
** A chunk is read line by line until it compiles or fails for a reason
** other than reaching its end (lua.c's "<eof>" test); each attempt tries
** "return <chunk>" first, so expressions print their values.  On a
** terminal, lines come from readline's callback interface, which lets
** Ctrl-C at the prompt just drop the line: the signal handler only sets a
** flag, and the loop notices it when pselect returns.  Everything else
** (pipes, files) reads plain lines, without prompts or history.
*/
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <unistd.h>

#include <readline/readline.h>
#include <readline/history.h>

#include <lua.h>
#include <lauxlib.h>

#include "repl/repl.h"
#include "graph/err.h"
#include "exec/measure.h"

#define CHUNKNAME   "=stdin"
#define EOFMARK     "<eof>"
#define HISTORY_MAX 1000

/* Prompts; readline must be told which bytes take no room (\001..\002). */
#define PROMPT1     "fl> "
#define PROMPT2     "..> "
#define COLOUR(p)   "\001\033[1;36m\002" p "\001\033[0m\002"

/* What reading one line gave. */
enum { LINE_OK, LINE_EOF, LINE_INTR };


/* --- history ------------------------------------------------------------- */

char *repl_history_path(void) {
  const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
  const char *base, *sub;
  char *p;
  size_t n;
  /* the XDG spec says a relative XDG_STATE_HOME is invalid: ignore it */
  if (xdg != NULL && xdg[0] == '/') { base = xdg; sub = "/fuselab/history"; }
  else if (home != NULL && home[0] != '\0') {
    base = home;
    sub = "/.local/state/fuselab/history";
  }
  else return NULL;
  n = strlen(base) + strlen(sub) + 1;
  if ((p = malloc(n)) != NULL) snprintf(p, n, "%s%s", base, sub);
  return p;
}

/* mkdir -p of the directories above path, mode 0700 as XDG asks. */
static void make_parents(const char *path) {
  char *d = strdup(path), *s;
  if (d == NULL) return;
  for (s = strchr(d + 1, '/'); s != NULL; s = strchr(s + 1, '/')) {
    *s = '\0';
    mkdir(d, 0700);  /* EEXIST and the rest show up when the file opens */
    *s = '/';
  }
  free(d);
}

/* Load the history file and make sure it exists, since readline's
** append_history does not create it.  A history that cannot be written
** costs a note, never the session. */
static int history_open(struct repl *r) {
  struct stat st;
  int fd;
  using_history();
  stifle_history(HISTORY_MAX);
  /* timestamps mark where an entry starts, so a multi-line chunk comes
  ** back as one entry in the next session */
  history_comment_char = '#';  /* the timestamp lines' mark (none by default) */
  history_write_timestamps = 1;
  history_multiline_entries = 1;
  if ((r->history = repl_history_path()) == NULL) return 0;
  make_parents(r->history);
  /* opened without following a link or blocking on a FIFO, and used only
  ** when it is a regular file: readline's own open would wait forever on a
  ** FIFO planted there */
  fd = open(r->history, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    char q[600];
    fprintf(stderr, "(history will not be saved: %s: %s)\n", err_quote(r->history, q, sizeof q),
            fd < 0 ? strerror(errno) : "not a regular file");
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  read_history(r->history);
  return 1;
}

static int history_ok;  /* the file can be appended to */

/* Keep a chunk (one entry even when it spans lines), skipping repeats.
** Written at once, so a killed session loses nothing. */
static void history_save(struct repl *r, const char *chunk) {
  HIST_ENTRY *last = history_length > 0 ? history_get(history_base +
                                                      history_length - 1)
                                        : NULL;
  if (chunk[0] == '\0' || (last != NULL && strcmp(last->line, chunk) == 0))
    return;
  add_history(chunk);
  if (history_ok && append_history(1, r->history) != 0) history_ok = 0;
}

static void history_close(struct repl *r) {
  if (history_ok) history_truncate_file(r->history, HISTORY_MAX);
}


/* --- reading a line on a terminal ----------------------------------------- */

static volatile sig_atomic_t got_int, got_winch, got_cont;

static void on_sigint(int sig) { (void)sig; got_int = 1; }
static void on_sigwinch(int sig) { (void)sig; got_winch = 1; }
static void on_sigcont(int sig) { (void)sig; got_cont = 1; }

static char *cb_line;  /* what readline handed to on_line */
static int cb_done;    /* on_line was called */

/* The line is complete (NULL: Ctrl-D on an empty line).  The handler is
** removed at once, so the code the line holds runs with the terminal in
** its normal mode. */
static void on_line(char *line) {
  cb_line = line;
  cb_done = 1;
  rl_callback_handler_remove();
}

/* Drop what is typed and leave the prompt, as after a signal. */
static void cancel_line(void) {
  rl_free_line_state();
  rl_callback_sigcleanup();
  rl_cleanup_after_signal();  /* cursor below the line, terminal restored */
  rl_callback_handler_remove();
  rl_echo_signal_char(SIGINT);
  fputc('\n', rl_outstream);
  fflush(rl_outstream);
  using_history();  /* the next line starts after the last entry again */
}

/* SIGINT, SIGWINCH and SIGCONT are blocked except inside pselect, so a
** signal can neither slip in between the flag test and the wait nor land
** in the middle of readline's own work. */
static int tty_readline(const char *prompt, char **out) {
  sigset_t block, old;
  int fd = fileno(rl_instream), status = LINE_OK;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGWINCH);
  sigaddset(&block, SIGCONT);
  got_int = got_cont = 0;
  sigprocmask(SIG_BLOCK, &block, &old);
  cb_done = 0;
  cb_line = NULL;
  rl_callback_handler_install(prompt, on_line);
  while (!cb_done) {
    fd_set in;
    int n;
    if (got_int) {
      cancel_line();
      status = LINE_INTR;
      break;
    }
    if (got_winch) { got_winch = 0; rl_resize_terminal(); }
    if (got_cont) {  /* back from Ctrl-Z: the shell may have reset the tty */
      got_cont = 0;
      rl_deprep_terminal();
      rl_prep_terminal(1);
      rl_on_new_line();
      rl_forced_update_display();
    }
    FD_ZERO(&in);
    FD_SET(fd, &in);
    n = pselect(fd + 1, &in, NULL, NULL, NULL, &old);
    if (n < 0) {
      if (errno == EINTR) continue;
      rl_callback_handler_remove();  /* the terminal went away: end */
      break;
    }
    rl_callback_read_char();
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  *out = cb_line;
  if (status == LINE_INTR) {
    free(cb_line);
    *out = NULL;
    return LINE_INTR;
  }
  if (cb_line == NULL) {  /* Ctrl-D: leave the shell's prompt a line of its own */
    fputc('\n', stdout);
    fflush(stdout);
    return LINE_EOF;
  }
  return LINE_OK;
}

/* The handlers stay for the whole session: outside the prompt, SIGINT
** belongs to repl_docall, which saves and restores this one. */
static void tty_open(lua_State *L) {
  struct sigaction sa;
  rl_readline_name = "fuselab";  /* for $if fuselab in ~/.inputrc */
  rl_instream = stdin;           /* readline sets them only on first use */
  rl_outstream = stdout;
  rl_catch_signals = 0;          /* the loop handles them (see above) */
  rl_catch_sigwinch = 0;
  rl_change_environment = 0;     /* leave LINES and COLUMNS alone */
  repl_complete_init(L);
  /* SA_RESTART spares the user's own reads a resize or a Ctrl-Z; pselect
  ** returns on a signal whatever the flags say */
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, NULL);
  sa.sa_handler = on_sigwinch;
  sigaction(SIGWINCH, &sa, NULL);
  sa.sa_handler = on_sigcont;
  sigaction(SIGCONT, &sa, NULL);
}

static void tty_close(void) {
  signal(SIGINT, SIG_DFL);
  signal(SIGWINCH, SIG_DFL);
  signal(SIGCONT, SIG_DFL);
}


/* --- reading a line from anything else --------------------------------- */

static int plain_readline(char **out) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, stdin);
  if (n < 0) {
    free(line);
    *out = NULL;
    return LINE_EOF;
  }
  if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
  if (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
  *out = line;
  return LINE_OK;
}

/* Readline sits behind these three, as in lua.c. */
#define repl_readline(r, p, out) \
  ((r)->tty ? tty_readline(p, out) : plain_readline(out))
#define repl_saveline(r, s)  do { if ((r)->tty) history_save(r, s); } while (0)
#define repl_freeline(s)     free(s)


/* --- compiling a chunk -------------------------------------------------- */

/* A syntax error that ends at the end of the text: more lines may fix it. */
static int incomplete(lua_State *L, int status) {
  size_t len, ml = sizeof EOFMARK - 1;
  const char *msg;
  if (status != LUA_ERRSYNTAX) return 0;
  msg = lua_tolstring(L, -1, &len);
  return len >= ml && strcmp(msg + len - ml, EOFMARK) == 0;
}

/* Length of text without trailing blanks and one trailing ';' (which
** asks for the value not to be printed: *quiet is set). */
static size_t strip_semicolon(const char *text, size_t len, int *quiet) {
  while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\t' ||
                     text[len - 1] == '\n' || text[len - 1] == '\r'))
    len--;
  *quiet = len > 0 && text[len - 1] == ';';
  return *quiet ? len - 1 : len;
}

/* Compile "return <text>": pushes the function (LUA_OK) or the message. */
static int load_return(lua_State *L, const char *text, size_t len) {
  luaL_Buffer b;
  int status;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "return ");
  luaL_addlstring(&b, text, len);
  luaL_pushresult(&b);
  status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1),
                           CHUNKNAME);
  lua_remove(L, -2);
  return status;
}

/* Of the two failed readings, the statement one's message is usually the
** one to show; but for `1 +* 2` it blames the first token ("unexpected
** symbol near '1'") while the expression reading points at the '*'. */
static void pick_message(lua_State *L) {
  const char *st = lua_tostring(L, -1), *ex = lua_tostring(L, -2);
  if (st && ex && strstr(st, "unexpected symbol near") &&
      !strstr(ex, "<eof> expected") && !strstr(ex, "<eof>' expected"))
    lua_pop(L, 1);
  else
    lua_remove(L, -2);
}

enum { CHUNK_RUN, CHUNK_ERROR, CHUNK_CANCEL };

/* The chunk text so far is on the stack.  Read more lines until it
** compiles (the function replaces the text: CHUNK_RUN), fails for good
** (the message replaces it: CHUNK_ERROR) or Ctrl-C drops it (the text is
** popped: CHUNK_CANCEL).  *quiet: a trailing ';' asked for no printing. */
static int loadchunk(struct repl *r, int *quiet) {
  lua_State *L = r->L;
  for (;;) {
    size_t len, elen;
    const char *text = lua_tolstring(L, -1, &len);
    int rs, ss, more;
    char *line;
    elen = strip_semicolon(text, len, quiet);
    rs = load_return(L, text, elen);
    if (rs == LUA_OK) break;
    more = incomplete(L, rs);
    ss = luaL_loadbuffer(L, text, len, CHUNKNAME);
    if (ss == LUA_OK) { lua_remove(L, -2); break; }
    more = more || incomplete(L, ss);
    if (!more) {
      pick_message(L);
      repl_saveline(r, lua_tostring(L, -2));
      lua_remove(L, -2);
      return CHUNK_ERROR;
    }
    switch (repl_readline(r, r->colour ? COLOUR(PROMPT2) : PROMPT2, &line)) {
      case LINE_INTR:
        lua_pop(L, 3);
        return CHUNK_CANCEL;
      case LINE_EOF:  /* the text ends unfinished: say what is missing */
        pick_message(L);
        repl_saveline(r, lua_tostring(L, -2));
        lua_remove(L, -2);
        return CHUNK_ERROR;
    }
    lua_pop(L, 2);
    lua_pushliteral(L, "\n");
    lua_pushstring(L, line);
    lua_concat(L, 3);
    repl_freeline(line);
  }
  repl_saveline(r, lua_tostring(L, -2));
  lua_remove(L, -2);
  return CHUNK_RUN;
}


/* --- running and printing ---------------------------------------------- */

static void print_time(struct repl *r, double s) {
  char buf[64];
  if (s < 1e-3) snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1.0) snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else snprintf(buf, sizeof buf, "%.3f s", s);
  printf("%stime %s (one run)%s\n", r->colour ? REPL_DIM : "", buf,
         r->colour ? REPL_RESET : "");
  fflush(stdout);
}

/* The one result at idx is what the line's own code printed already and
** noted with fl._shown (cm:explain() prints its text and returns it). */
static int already_shown(lua_State *L, int idx) {
  int same;
  lua_getfield(L, LUA_REGISTRYINDEX, REPL_SHOWN_KEY);
  same = !lua_isnil(L, -1) && lua_rawequal(L, -1, idx);
  lua_pop(L, 1);
  return same;
}

/* Run the function on top of the stack and print what it returns. */
static void run(struct repl *r, int quiet) {
  lua_State *L = r->L;
  int base = lua_gettop(L) - 1, status, n;
  double t0, dt;
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, REPL_SHOWN_KEY);
  t0 = meas_now();
  status = repl_docall(L, 0, LUA_MULTRET);
  dt = meas_now() - t0;
  n = lua_gettop(L) - base;
  if (status == LUA_OK && n > 0) repl_remember(L, base + 1);
  if (status == LUA_OK && n == 1 && already_shown(L, base + 1)) quiet = 1;
  if (status == LUA_OK && n > 0 && !quiet) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_pushcfunction(L, repl_print);
    lua_insert(L, base + 1);
    status = repl_docall(L, n, 0);
  }
  fflush(stdout);
  repl_report(L, status, r->colour_err);
  lua_settop(L, base);
  if (r->timing) print_time(r, dt);
}

void repl_loop(struct repl *r) {
  lua_State *L = r->L;
  int top = lua_gettop(L);
  repl_show_init(r->colour);
  if (r->tty) {
    tty_open(L);
    history_ok = history_open(r);
  }
  while (!r->quit) {
    char *line;
    int quiet, st = repl_readline(r, r->colour ? COLOUR(PROMPT1) : PROMPT1,
                                  &line);
    if (st == LINE_EOF) break;
    if (st == LINE_INTR) continue;
    /* ':' starts a command; '::' is a Lua label, left to Lua */
    if (line[0] == ':' && line[1] != ':') {
      repl_saveline(r, line);
      repl_meta(r, line);
      repl_freeline(line);
      continue;
    }
    if (line[0] == '?') {  /* ? NAME: help on it (no Lua line starts with ?) */
      repl_saveline(r, line);
      repl_help_line(r, line);
      repl_freeline(line);
      continue;
    }
    lua_pushstring(L, line);
    repl_freeline(line);
    switch (loadchunk(r, &quiet)) {
      case CHUNK_RUN: run(r, quiet); break;
      case CHUNK_ERROR: repl_report(L, LUA_ERRSYNTAX, r->colour_err); break;
    }
    lua_settop(L, top);
  }
  if (r->tty) {
    history_close(r);
    tty_close();
  }
}
