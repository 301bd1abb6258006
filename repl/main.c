/*
** main.c -- the fuselab binary: options, the four ways of running code
** (script, -e, stdin, REPL) and the one protected call they all use.
**
** Invariant: user code only ever runs inside repl_docall, so every error
** reaches a traceback handler and every Ctrl-C becomes a Lua error at the
** next Lua instruction; nothing typed or read can take the process down.
** The layout follows lua.c: main opens the state and runs pmain protected.
*/
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "exec/measure.h"
#include "scripting/lfl.h"
#include "repl/repl.h"

static const char *progname = PACKAGE_NAME;


/* --- Ctrl-C -------------------------------------------------------------- */

/* The state a running chunk belongs to, for the signal handler. */
static lua_State *globalL = NULL;
/* Ctrl-C presses not yet turned into an error: a long C kernel does not
** return to Lua at once, and the user may press again meanwhile. */
static volatile sig_atomic_t pending = 0;

/* Hook installed by the handler: the first Lua instruction run after the
** signal raises, which unwinds to repl_docall like any error. */
static void lstop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  pending = 0;
  luaL_error(L, "interrupted!");
}

/* Setting a hook is the only thing that is safe to do to a Lua state from
** a signal handler (lua_sethook is documented as such).  A third press
** while C code keeps running gives up and lets SIGINT end the process, so
** a runaway kernel can always be left. */
static void laction(int sig) {
  static const char msg[] = "\n(interrupt pending: the running C code has not "
                            "returned yet; Ctrl-C again quits)\n";
  int mask = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  fl_interrupt = 1;   /* a compiler run being waited on stops (exec/cache_disk.c) */
  if (++pending >= 3) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (pending == 2) {
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
  }
  lua_sethook(globalL, lstop, mask, 1);
}

/* A frame of fuselab's own embedded Lua (chunk "=compile.lua" and the
** like; a user's file is "@path", typed input "=stdin"). */
static int own_frame(const lua_Debug *ar) {
  static const char *const own[] = {"=compile.lua", "=nn.lua", "=onnx.lua", "=checklist.lua"};
  size_t i;
  for (i = 0; i < sizeof own / sizeof *own; i++)
    if (strcmp(ar->source, own[i]) == 0) return 1;
  return 0;
}

/* The level the caller's frames start at, past the error's raise and
** fuselab's own frames around it: an error raised inside a traced
** function (fl.compile) already carries the frames of where it happened,
** and what lies between is fuselab's, not the user's. */
static int caller_level(lua_State *L) {
  lua_Debug ar;
  int level, last = 0;
  for (level = 1; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "S", &ar)) break;
    if (own_frame(&ar)) last = level;
    else if (strcmp(ar.what, "C") != 0) break;
  }
  return last + 1;
}

/* Message handler: a string gets a traceback; another value its __tostring
** or its type.  A nil method, field or global gets the names it was
** likely meant to be (suggest.c).  A message that carries its own traceback gets the
** caller's frames added to it, one traceback, not two.  The "[C]: in ?"
** frame at the bottom is this program's own protected call, not the
** user's code, so it is dropped. */
static int msghandler(lua_State *L) {
  static const char tail[] = "\n\t[C]: in ?", head[] = "stack traceback:";
  const char *msg = lua_tostring(L, 1);
  size_t len, tl = sizeof tail - 1;
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)",
                          luaL_typename(L, 1));
  }
  /* a misspelt name gets the names it could have been */
  if (repl_did_you_mean(L, msg, 1)) msg = lua_tostring(L, -1);
  if (strstr(msg, "\nstack traceback:\n")) {
    const char *frames;
    luaL_traceback(L, L, NULL, caller_level(L));
    frames = lua_tostring(L, -1);
    if (strncmp(frames, head, sizeof head - 1) == 0) frames += sizeof head - 1;
    lua_pushfstring(L, "%s%s", msg, frames);
  } else {
    luaL_traceback(L, L, msg, 1);
  }
  msg = lua_tolstring(L, -1, &len);
  if (len >= tl && memcmp(msg + len - tl, tail, tl) == 0)
    lua_pushlstring(L, msg, len - tl);
  return 1;
}

/* After an error reaches the top level no capture can still be running:
** end any trace left recording (the capture code ends its own on every
** path; this is the backstop that keeps the session usable). */
static void end_stale_trace(lua_State *L) {
  if (lua_getglobal(L, "fl") == LUA_TTABLE &&
      lua_getfield(L, -1, "_trace_reset") == LUA_TFUNCTION) {
    if (lua_pcall(L, 0, 0, 0) != LUA_OK) lua_pop(L, 1);
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

int repl_docall(lua_State *L, int narg, int nres) {
  static int depth;
  struct sigaction sa, old;
  int status;
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  globalL = L;
  pending = 0;
  /* no SA_RESTART: a blocking read in io.read returns, and the hook fires */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = laction;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  if (depth == 0) fl_interrupt = 0;
  depth++;
  status = lua_pcall(L, narg, nres, base);
  depth--;
  sigaction(SIGINT, &old, NULL);
  if (pending) {  /* a press that came too late to fire: drop its hook */
    lua_sethook(L, NULL, 0, 0);
    pending = 0;
  }
  lua_remove(L, base);
  if (status != LUA_OK && depth == 0) end_stale_trace(L);
  return status;
}

/* The first line (the error itself) in red; the traceback plain. */
static void message(const char *prefix, const char *msg, int colour) {
  size_t first = strcspn(msg, "\n");
  if (colour) fputs(REPL_RED, stderr);
  if (prefix) fprintf(stderr, "%s: ", prefix);
  fwrite(msg, 1, first, stderr);
  if (colour) fputs(REPL_RESET, stderr);
  fputs(msg + first, stderr);
  fputc('\n', stderr);
  fflush(stderr);
}

int repl_report(lua_State *L, int status, int colour) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    message(NULL, msg ? msg : "(error object is not a string)", colour);
    lua_pop(L, 1);
  }
  return status;
}

/* Script-mode report: "fuselab: " first, as a command-line tool says. */
static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    message(progname, msg ? msg : "(error object is not a string)", 0);
    lua_pop(L, 1);
  }
  return status;
}



/* --- options ------------------------------------------------------------- */

static void print_version(void) {
  printf("%s %s (%s)\n", PACKAGE_NAME, PACKAGE_VERSION, LUA_RELEASE);
}

static void print_usage(FILE *f) {
  char *hist = repl_history_path();
  fprintf(f,
    "usage: %s [options] [script [args]]\n"
    "Start the fuselab REPL, or run a Lua script with fuselab loaded: the\n"
    "globals fl and nn are set, and require \"fuselab\" gives the same fl.\n"
    "\n"
    "  -e code        run code (may be repeated; no REPL unless -i)\n"
    "  -i             enter the REPL after the script or the -e code\n"
    "  -              read the script from standard input\n"
    "  --             stop handling options\n"
    "  -h, --help     print this help and leave\n"
    "  -v, --version  print the version and leave\n"
    "\n"
    "The script gets its arguments in the table arg (arg[0] is the script)\n"
    "and as `...`.  An error prints a traceback and exits with status 1.\n"
    "With no script and standard input not a terminal, all of standard\n"
    "input runs as one script, without prompts.\n"
    "\n"
    "In the REPL, an expression's value is printed (a trailing ; stops\n"
    "that), Tab completes, Ctrl-C stops a computation, Ctrl-D leaves, and\n"
    ":help lists the commands.  History is kept in\n"
    "$XDG_STATE_HOME/fuselab/history (~/.local/state/fuselab/history when\n"
    "XDG_STATE_HOME is unset); here: %s\n"
    "\n"
    "Environment:\n"
    "  NO_COLOR           set and not empty: no colour (colour is used only\n"
    "                     on a terminal anyway)\n"
    "  XDG_STATE_HOME     where the history file goes\n"
    "  FUSELAB_DEBUG      1..5: kernel counts and cache hits, kernel times,\n"
    "                     fusion decisions, generated source, IR\n"
    "  FUSELAB_CACHE_DIR  the compiled-kernel cache (used only when it is\n"
    "                     yours and nobody else can write it)\n"
    "  FUSELAB_CACHE_MAX_MB     its size cap (default 2048)\n"
    "  FUSELAB_COMPILE_TIMEOUT  seconds a compiler run may take (default 120)\n",
    progname, hist ? hist : "(none: HOME is unset)");
  free(hist);
}

/* What collectargs found on the command line. */
struct args {
  int script;     /* index in argv of the script (0: none) */
  int has_e;      /* some -e */
  int has_i;      /* -i */
  int has_v;      /* -v / --version */
  int help;       /* -h / --help */
  int bad;        /* index of a bad option (0: none) */
};

/* Options come before the script; everything after it is its arguments
** (the same rule as lua.c).  -e's code is fetched again in runargs. */
static void collectargs(char **argv, struct args *a) {
  int i;
  memset(a, 0, sizeof *a);
  for (i = 1; argv[i] != NULL; i++) {
    const char *s = argv[i];
    if (s[0] != '-') { a->script = i; return; }
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) { a->help = 1; continue; }
    if (strcmp(s, "--version") == 0 || strcmp(s, "-v") == 0) { a->has_v = 1; continue; }
    if (strcmp(s, "--") == 0) {
      if (argv[i + 1] != NULL) a->script = i + 1;
      return;
    }
    if (strcmp(s, "-") == 0) { a->script = i; return; }
    if (strcmp(s, "-i") == 0) { a->has_i = 1; continue; }
    if (s[1] == 'e') {
      a->has_e = 1;
      if (s[2] == '\0') {
        if (argv[++i] == NULL) { a->bad = i - 1; return; }
      }
      continue;
    }
    a->bad = i;
    return;
  }
}

/* arg[0] is the script, arg[1..] its arguments, arg[-1..] the interpreter
** and options before it, as in lua.c. */
static void createargtable(lua_State *L, char **argv, int argc, int script) {
  int i;
  lua_createtable(L, argc - script - 1 > 0 ? argc - script - 1 : 0,
                  script + 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = repl_docall(L, 0, 0);
  return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* Push arg[1..#arg] as the script's varargs. */
static int pushargs(lua_State *L) {
  int i, n;
  if (lua_getglobal(L, "arg") != LUA_TTABLE)
    luaL_error(L, "'arg' is not a table");
  n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  for (i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -i);
  return n;
}

static int handle_script(lua_State *L, char **argv) {
  const char *fname = argv[0];
  int status;
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0)
    fname = NULL;  /* standard input */
  status = luaL_loadfile(L, fname);
  if (status == LUA_OK) status = repl_docall(L, pushargs(L), LUA_MULTRET);
  return report(L, status);
}

/* The -e options, in order.  Returns 0 when one failed. */
static int runargs(lua_State *L, char **argv, int n) {
  int i;
  for (i = 1; i < n; i++) {
    if (argv[i][0] == '-' && argv[i][1] == 'e') {
      const char *code = argv[i][2] ? argv[i] + 2 : argv[++i];
      if (dostring(L, code, "=(command line)") != LUA_OK) return 0;
    }
  }
  return 1;
}


/* --- the state ------------------------------------------------------------ */

/* The standard libraries, then fuselab as package.loaded.fuselab (so
** `require "fuselab"` in a script gets this very table) and as the globals
** fl and nn. */
static void openlibs(lua_State *L) {
  luaL_openlibs(L);
  luaL_requiref(L, "fuselab", luaopen_fuselab, 0);
  lua_getfield(L, -1, "nn");
  lua_setglobal(L, "nn");
  lua_setglobal(L, "fl");
}

static int colour_wanted(int fd) {
  const char *nc = getenv("NO_COLOR");
  const char *term = getenv("TERM");
  if (nc != NULL && nc[0] != '\0') return 0;
  if (term != NULL && strcmp(term, "dumb") == 0) return 0;
  return isatty(fd);
}

static void run_repl(lua_State *L, int banner) {
  struct repl r;
  memset(&r, 0, sizeof r);
  r.L = L;
  r.tty = isatty(STDIN_FILENO);
  r.colour = colour_wanted(STDOUT_FILENO);
  r.colour_err = r.colour && colour_wanted(STDERR_FILENO);
  if (r.tty && banner) {
    printf("%s %s (%s)  :help for help, Ctrl-D to leave\n",
           PACKAGE_NAME, PACKAGE_VERSION, LUA_RELEASE);
    fflush(stdout);
  }
  repl_loop(&r);
  free(r.history);
}

/* Runs protected; the exit status is left as a boolean on the stack. */
static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  struct args a;
  int script;
  luaL_checkversion(L);
  collectargs(argv, &a);
  if (a.bad) {
    if (argv[a.bad][1] == 'e')
      fprintf(stderr, "%s: '%s' needs code after it\n", progname, argv[a.bad]);
    else
      fprintf(stderr, "%s: unknown option '%s'\n", progname, argv[a.bad]);
    fprintf(stderr, "Try '%s --help'.\n", progname);
    lua_pushinteger(L, 2);
    return 1;
  }
  if (a.help) { print_usage(stdout); lua_pushinteger(L, 0); return 1; }
  if (a.has_v) {
    print_version();
    if (!a.script && !a.has_e && !a.has_i) { lua_pushinteger(L, 0); return 1; }
  }
  script = a.script;
  openlibs(L);
  createargtable(L, argv, argc, script);
  lua_gc(L, LUA_GCRESTART);
  if (!runargs(L, argv, script > 0 ? script : argc)) {
    lua_pushinteger(L, 1);
    return 1;
  }
  if (script && handle_script(L, argv + script) != LUA_OK && !a.has_i) {
    lua_pushinteger(L, 1);
    return 1;
  }
  if (a.has_i) {
    run_repl(L, 1);
  }
  else if (!script && !a.has_e && !a.has_v) {
    if (isatty(STDIN_FILENO)) run_repl(L, 1);
    else if (dochunk(L, luaL_loadfile(L, NULL)) != LUA_OK) {
      lua_pushinteger(L, 1);
      return 1;
    }
  }
  lua_pushinteger(L, 0);
  return 1;
}

/* OpenMP's idle threads spin before they sleep.  On a quiet machine a
** short spin is what keeps a compiled call fast: waking a sleeping thread
** costs 40-80 us under a hypervisor, and a 2-layer GPT call starts some
** fifty parallel loops (passive waiting: 13.4 ms, a 10,000-round spin:
** 11.3 ms; a 32768-float elementwise graph 0.105 vs 0.050 ms).  On a
** machine whose cores other programs keep busy, a spinning thread takes
** the CPU from the one thread the others wait for, and sleeping at once
** is faster (GPT 20.5 vs 27.6 ms, the small graph 0.09 vs 0.30 ms;
** libgomp's own 300,000 rounds made a 0.17 ms graph take 13 ms).  README,
** "Timings you can trust, and threads on a busy machine"; bench/omp_wait.sh
** measures both.
**
** libgomp reads its variables when it is loaded, before main, so when the
** user chose neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT the binary looks
** at the load as it starts, sets one of them, says why in
** FUSELAB_OMP_WAIT (fl.blas_info().threads), and runs itself again, once;
** if that exec fails it goes on as it is.  Busy: other processes use half
** a core or more over 40 ms (/proc/stat, as fl.measure counts them). */
#define OMP_QUIET_SPIN "10000"

static void omp_wait_default(char **argv) {
  char why[160], msg[240];
  double others;
  int busy;
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
  others = meas_others_now(0.04);
  busy = others < 0 || others >= MEAS_BUSY_CORES;  /* unknown: the safe side */
  if (others < 0) snprintf(why, sizeof why, "the machine's load is unknown (no /proc/stat)");
  else snprintf(why, sizeof why, "machine %s at start (other processes used %.2f cores)",
                busy ? "busy" : "quiet", others);
  if (busy) {
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    snprintf(msg, sizeof msg, "OMP_WAIT_POLICY=passive: idle threads sleep at once; %s", why);
  }
  else {
    if (setenv("GOMP_SPINCOUNT", OMP_QUIET_SPIN, 1) != 0) return;
    snprintf(msg, sizeof msg, "GOMP_SPINCOUNT=" OMP_QUIET_SPIN ": idle threads spin briefly, then sleep; %s", why);
  }
  setenv("FUSELAB_OMP_WAIT", msg, 1);
  execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
  int status, code;
  lua_State *L;
  if (argv[0] == NULL) {  /* no program name: lua.c's guard */
    static char *none[] = {PACKAGE_NAME, NULL};
    argv = none;
    argc = 1;
  }
  omp_wait_default(argv);
  L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create the Lua state: not enough memory\n",
            progname);
    return EXIT_FAILURE;
  }
  lua_gc(L, LUA_GCSTOP);  /* no collection while the libraries open */
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  code = (int)lua_tointeger(L, -1);
  if (status != LUA_OK) {
    report(L, status);
    code = EXIT_FAILURE;
  }
  lua_close(L);
  fflush(stdout);
  return ferror(stdout) ? EXIT_FAILURE : code;
}
