/*
** repl.h -- what the parts of the fuselab binary share: the running
** session (colour, timing, where lines come from) and the protected call
** every piece of user code goes through.
**
** main.c      options, modes (script, -e, -i, stdin), protected calls, Ctrl-C
** loop.c      the read-eval-print loop: readline, continuation, auto-print
** show.c      how results are printed
** complete.c  Tab completion of globals, fields and methods
** suggest.c   "did you mean ...?" for a misspelt name in an error
** meta.c      the `:` commands and their help texts
** apidoc.c    :help NAME and ? NAME, from doc/API.md compiled in
*/
#ifndef REPL_H
#define REPL_H

#include <lua.h>

/* One REPL session; lives in pmain's frame for the life of the loop. */
struct repl {
  lua_State *L;
  int tty;            /* lines come through readline (stdin is a terminal) */
  int colour;         /* stdout is a colour terminal and NO_COLOR is unset */
  int colour_err;     /* the same for stderr */
  int timing;         /* `:time on`: print the wall time of each line */
  int quit;           /* `:quit` was typed: leave after this line */
  char *history;      /* history file path (malloc'd), NULL when none */
};

/* Registry key where fl._shown notes a result already printed (the same
** string as LFL_SHOWN_KEY in scripting/lfl.h): the REPL does not echo it. */
#define REPL_SHOWN_KEY "fuselab.shown"

/* ANSI sequences, used only when the colour fields above say so. */
#define REPL_RED    "\033[31m"
#define REPL_BOLD   "\033[1m"
#define REPL_DIM    "\033[2m"
#define REPL_RESET  "\033[0m"

/* --- main.c ------------------------------------------------------------ */
/* Call the function below narg arguments on L's stack, with a traceback
** message handler and Ctrl-C turned into the Lua error "interrupted!".
** Same contract as lua_pcall(L, narg, nres, <handler>). */
int repl_docall(lua_State *L, int narg, int nres);
/* When status is not LUA_OK, print the message on top of the stack to
** stderr (red on a colour terminal) and pop it.  Returns status. */
int repl_report(lua_State *L, int status, int colour);

/* --- loop.c ------------------------------------------------------------ */
/* Read, evaluate and print until end of input or `:quit`. */
void repl_loop(struct repl *r);
/* Where the history file lives: $XDG_STATE_HOME/fuselab/history, else
** ~/.local/state/fuselab/history.  Malloc'd; NULL when neither is known. */
char *repl_history_path(void);

/* --- show.c ------------------------------------------------------------ */
/* lua_CFunction: print its arguments, tab-separated, then a newline.
** Called through repl_docall, as a __tostring may fail or loop. */
int repl_print(lua_State *L);
/* Whether repl_print colours the tables it spells out. */
void repl_show_init(int colour);

/* --- complete.c -------------------------------------------------------- */
/* Hook Tab completion for the session's state into readline. */
void repl_complete_init(lua_State *L);
/* Receives one name (not NUL-terminated) that completion would offer. */
typedef void (*repl_name_fn)(void *ud, const char *name, size_t len);
/* Hands each the names Tab offers after `v.` for the value v at idx
** (after `v:` when methods: callables only); with type, idx is instead a
** metatable and the names are those of the values it governs.  Names
** starting with '_' are left out.  Runs no Lua code; may raise only a
** memory error (call it protected). */
void repl_names_of(lua_State *L, int idx, int methods, int type,
                   repl_name_fn each, void *ud);

/* --- suggest.c --------------------------------------------------------- */
/* Edit distance between a and b in half steps: an insertion, deletion,
** substitution or swap of neighbours costs 2, a change of case only 1. */
int repl_distance(const char *a, const char *b);
/* When msg (an error message) says a name is nil (method 'decompse',
** field 'Linaer', global 'prnt') and a name of the receiver, else of
** fuselab's objects, is close, pushes msg with "; did you mean NAME?" at
** the end of its first line and returns 1; else pushes nothing, returns
** 0.  level: the frame that raised the error, as lua_getstack counts.
** Called from the message handler: it never raises. */
int repl_did_you_mean(lua_State *L, const char *msg, int level);

/* --- meta.c ------------------------------------------------------------ */
/* Run the `:` command in line (which starts with ':'). */
void repl_meta(struct repl *r, const char *line);
/* Remember the value at idx as the last result (:draw draws it). */
void repl_remember(lua_State *L, int idx);
/* NULL-terminated names of the commands and of the :help topics. */
extern const char *const repl_meta_names[];
extern const char *const repl_help_topics[];

/* --- apidoc.c ---------------------------------------------------------- */
/* Print the doc/API.md entries that document name (fl.zeros, x:reshape,
** cm:stats, nn.Linear, zeros); 0 when none does (nothing printed). */
int repl_apidoc(const char *name);
/* Print "nearest: ..." names like name, or nothing. */
void repl_apidoc_suggest(const char *name);
/* NULL-terminated names doc/API.md documents, for completion. */
const char *const *repl_apidoc_names(void);
/* `? NAME` typed at the prompt (line starts with '?'). */
void repl_help_line(struct repl *r, const char *line);

#endif
