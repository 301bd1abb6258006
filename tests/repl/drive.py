#!/usr/bin/python3
"""drive.py -- the fuselab REPL driven through a pseudo-terminal.

Usage: drive.py START
Runs every test below against $FUSELAB and prints TAP lines numbered from
START (no plan: repl.sh prints it).  Each test gets a fresh REPL, so one
failure cannot cascade.  Needs pexpect (Debian: python3-pexpect); without
it every test is reported as skipped.
"""
import os
import re
import sys
import tempfile
import time

try:
    import pexpect
except ImportError:
    pexpect = None

FUSELAB = os.environ.get("FUSELAB", "fuselab")
TMP = tempfile.mkdtemp(prefix="fl-drive.")
SGR = re.compile(r"\x1b\[[0-9;]*m")                # colour
CSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[=>])")  # any terminal control
TESTS = []


def test(name):
    def register(fn):
        TESTS.append((name, fn))
        return fn
    return register


class Fail(Exception):
    pass


def spawn(*args, colour=False, state=None, extra=None):
    """A fresh fuselab on a terminal; NO_COLOR unless colour is wanted;
    extra: more environment variables."""
    env = dict(os.environ, TERM="xterm", XDG_STATE_HOME=state or TMP, **(extra or {}))
    env.pop("NO_COLOR", None)
    if not colour:
        env["NO_COLOR"] = "1"
    c = pexpect.spawn(FUSELAB, list(args), env=env, encoding="utf-8",
                      timeout=5, dimensions=(24, 200))
    c.transcript = []
    return c


def clean(s):
    """Text as a reader sees it: no control sequences, no carriage returns."""
    return CSI.sub("", s).replace("\r", "")


def prompt(c, p="fl> "):
    """Wait for prompt p; return the text printed before it."""
    try:
        c.expect_exact(p)
    except (pexpect.TIMEOUT, pexpect.EOF):
        raise Fail("no %r prompt; screen ends with %r"
                   % (p, clean(c.before or "")[-300:]))
    c.transcript.append(c.before + c.after)
    return clean(c.before)


def enter(c, text, p="fl> "):
    """Type a line, press Enter, return the output lines (echo excluded)."""
    c.send(text + "\r")
    out = prompt(c, p)
    lines = out.split("\n")
    return [l for l in lines[1:] if l != ""]


def expect_in(what, lines):
    if what not in lines:
        raise Fail("expected a line %r, got %r" % (what, lines))


def finish(c):
    """Ctrl-D on an empty line: the REPL must leave with status 0."""
    c.send("\x04")
    c.expect(pexpect.EOF)
    c.close()
    if c.exitstatus != 0:
        raise Fail("exit status %r (signal %r)" % (c.exitstatus, c.signalstatus))


@test("banner names fuselab, then the fl> prompt")
def _():
    c = spawn()
    out = prompt(c)
    if not re.search(r"fuselab \d+\.\d+", out):
        raise Fail("banner: %r" % out)
    finish(c)


@test("1+1 prints 2; several results are separated by a tab")
def _():
    c = spawn()
    prompt(c)
    expect_in("2", enter(c, "1+1"))
    expect_in("a\t1\ttrue", enter(c, '"a", 1, true'))
    finish(c)


@test("a trailing ; suppresses printing; statements print nothing")
def _():
    c = spawn()
    prompt(c)
    for line in ("1+1;", "x = 5", "x = 6;"):
        out = enter(c, line)
        if out:
            raise Fail("%r printed %r" % (line, out))
    expect_in("6", enter(c, "x"))
    finish(c)


@test("a multi-line function: ..> continuation, then the call works")
def _():
    c = spawn()
    prompt(c)
    enter(c, "function twice(a)", "..> ")
    enter(c, "  return a * 2", "..> ")
    enter(c, "end")
    expect_in("42", enter(c, "twice(21)"))
    finish(c)


@test("Tab completes fl.ze to fl.zeros( and the call runs")
def _():
    c = spawn()
    prompt(c)
    c.send("fl.ze\t")
    c.expect_exact("ros(")
    expect_in("3", enter(c, "2,3).shape[2]"))
    finish(c)


@test("Tab completes a tensor method (x:reshap -> x:reshape()")
def _():
    c = spawn()
    prompt(c)
    enter(c, "x = fl.zeros(2,3)")
    c.send("x:reshap\t")
    c.expect_exact("e(")
    expect_in("3", enter(c, "3,2).shape[1]"))
    finish(c)


@test("Tab completes globals and lists several candidates")
def _():
    c = spawn()
    prompt(c)
    c.send("pri\t")
    c.expect_exact("nt(")
    enter(c, ")")
    c.send("string.su\t\t")
    c.expect_exact("sub")  # the list shows the last part of each name
    c.send("\x03")
    prompt(c)
    finish(c)


@test("Tab completes a tensor's fields: x.sh -> x.shape, x.dt -> x.dtype")
def _():
    c = spawn()
    prompt(c)
    enter(c, "x = fl.zeros(2,3)")
    c.send("x.sh\t")
    c.expect_exact("ape")
    expect_in("2", enter(c, "[1]"))
    c.send("x.dt\t")
    c.expect_exact("ype")
    expect_in("float32", enter(c, ""))
    c.send("x.dev\t")
    c.expect_exact("ice")
    expect_in("cpu", enter(c, ""))
    finish(c)


@test("Tab completes the methods of compiled functions, modules, plans, programs")
def _():
    c = spawn()
    prompt(c)
    enter(c, "cm = fl.compile(function(a) return a + 1 end); m = nn.Linear(2, 3)")
    enter(c, "g = fl.capture(function(a) return a * 2 end, fl.ones(2)); p = g:fuse(); k = p:codegen('cpu')")
    for typed, rest, run, want in (
            ("cm:st", "ats(", ").calls", "0"),
            ("m:nparam", "eters(", ")", "9"),
            ("p:decis", "ions(", ")", None),
            ("k:sour", "ce(", ") ~= nil", "true"),
            ("g:decomp", "ose(", ") ~= nil", "true"),
            ("cm.hi", "ts", "", "0")):
        c.send(typed + "\t")
        try:
            c.expect_exact(rest)
        except pexpect.TIMEOUT:
            raise Fail("%r did not complete to %r: %r" % (typed, rest, clean(c.before)))
        out = enter(c, run)
        if want is not None:
            expect_in(want, out)
    c.send("cm:\t\t")  # the list holds every method
    c.expect_exact("explain")
    c.send("\x03")
    prompt(c)
    finish(c)


@test(":help NAME and ? NAME show doc/API.md's entry; an unknown name offers the nearest")
def _():
    c = spawn()
    prompt(c)
    out = "\n".join(enter(c, ":help fl.zeros"))
    if "fl.zeros(size...)" not in out or "A tensor of zeros" not in out:
        raise Fail(":help fl.zeros: %r" % out)
    out = "\n".join(enter(c, "? x:reshape"))
    if "x:reshape(sizes...)" not in out:
        raise Fail("? x:reshape: %r" % out)
    out = "\n".join(enter(c, "? cm:stats"))
    if "A table of counters" not in out:
        raise Fail("? cm:stats: %r" % out)
    out = "\n".join(enter(c, "?exp"))   # a name in a list of names
    if "Unary" not in out:
        raise Fail("?exp: %r" % out)
    out = "\n".join(enter(c, ":help fl.zeroz"))
    if "no help on 'fl.zeroz'" not in out or "nearest: fl.zeros" not in out:
        raise Fail(":help fl.zeroz: %r" % out)
    c.send(":help fl.eye\t")  # names complete after :help
    c.send("\x03")
    prompt(c)
    c.send("? nn.Line\t")
    c.expect_exact("ar")
    out = "\n".join(enter(c, ""))
    if "nn.Linear(i, o" not in out:
        raise Fail("? nn.Linear: %r" % out)
    finish(c)


@test("a table too long for the line prints over lines, = aligned; a short one on one line")
def _():
    c = spawn()
    prompt(c)
    expect_in("{2, 3}", enter(c, "fl.zeros(2, 3).shape"))
    enter(c, "cm = fl.compile(function(a) return a + 1 end); cm(fl.ones(2));")
    out = enter(c, "cm:stats()")
    if out[0] != "{" or out[-1] != "}":
        raise Fail("cm:stats(): %r" % out)
    calls = [l for l in out if l.lstrip().startswith("calls ")]
    recomp = [l for l in out if l.lstrip().startswith("recompile_reasons ")]
    if not calls or not recomp or calls[0].index("=") != recomp[0].index("="):
        raise Fail("keys not aligned: %r" % out)
    enter(c, "t = {} t.self = t")
    expect_in("{self = <cycle>}", enter(c, "t"))
    out = enter(c, "big = {} for i = 1, 1000 do big[i] = {i, ('x'):rep(300)} end return big")
    if len(out) > 420 or not any("more)" in l for l in out):
        raise Fail("a huge table printed %d lines, ends %r" % (len(out), out[-3:]))
    finish(c)


@test("tables are coloured on a colour terminal, plain with NO_COLOR")
def _():
    for colour in (False, True):
        c = spawn(colour=colour)
        prompt(c)
        c.send('{name = "x", n = 1}\r')
        c.expect_exact("\n")
        prompt(c)
        seen = "\x1b[32m" in c.transcript[-1]   # strings green
        finish(c)
        if seen != colour:
            raise Fail("colour=%s, green string %s" % (colour, "seen" if seen else "absent"))


@test("x[i] indexes like Torch7 at the prompt; out of range is a clear error")
def _():
    c = spawn()
    prompt(c)
    enter(c, "x = fl.arange(6):reshape(2, 3)")
    expect_in("5", enter(c, "x[2][3]"))
    expect_in("[int64 tensor of size 3]", enter(c, "x[-1]"))
    out = enter(c, "x[3]")
    if not any("x[3] is out of range for dim 1 of size 2" in l for l in out):
        raise Fail("x[3]: %r" % out)
    expect_in("{2, 3}", enter(c, "x.shape"))
    finish(c)


@test("cm:explain() prints its text once; the returned text is still there")
def _():
    c = spawn()
    prompt(c)
    enter(c, "cm = fl.compile(function(a) return a + 1 end); cm(fl.ones(2));")
    out = enter(c, "cm:explain()")
    if sum(1 for l in out if l.startswith("fl.compile: ")) != 1:
        raise Fail("cm:explain(): %r" % out)
    out = enter(c, "s = cm:explain()")
    expect_in("true", enter(c, 's:find("fl.compile: ", 1, true) == 1'))
    finish(c)


@test("fl.checklist prints its report once; the REPL does not spell out the returned table")
def _():
    c = spawn()
    prompt(c)
    c.timeout = 60
    out = enter(c, "fl.checklist(function(a) return a + 1 end, {inputs = {fl.ones(2)}})")
    if sum(l.count("go-live checklist: ") for l in out) != 1:
        raise Fail("fl.checklist(): %r" % out)
    if any("decision" in l and "=" in l for l in out):
        raise Fail("the returned table was echoed: %r" % out)
    expect_in("true", enter(c, 'r = fl.checklist(function(a) return a * 2 end, {inputs = {fl.ones(2)}, quiet = true}); print(type(r.decision) == "string")'))
    finish(c)


@test("an error prints a traceback and the REPL goes on")
def _():
    c = spawn()
    prompt(c)
    out = enter(c, 'error("boom")')
    if not any("boom" in l for l in out) or "stack traceback:" not in out:
        raise Fail("error output: %r" % out)
    expect_in("42", enter(c, "6*7"))
    finish(c)


@test("a syntax error is reported and the REPL goes on")
def _():
    c = spawn()
    prompt(c)
    out = enter(c, "1 +* 2")
    if not any("near '*'" in l for l in out):
        raise Fail("syntax error output: %r" % out)
    expect_in("3", enter(c, "1+2"))
    finish(c)


@test("Ctrl-C stops while true do end and returns to the prompt")
def _():
    c = spawn()
    prompt(c)
    c.send('print("looping") while true do end\r')
    c.expect_exact("looping\r\n")  # running, not still at the prompt
    time.sleep(0.2)
    c.send("\x03")
    out = prompt(c)
    if "interrupted!" not in out:
        raise Fail("after Ctrl-C: %r" % out)
    expect_in("alive", enter(c, 'print("alive")'))
    finish(c)


@test("Ctrl-C inside a first compiled call ends its trace: capture works after")
def _():
    c = spawn()
    prompt(c)
    enter(c, 'f = fl.compile(function(x) print("tracing") while true do end return x end)')
    c.send('f(fl.ones(2))\r')
    c.expect_exact("tracing\r\n")
    time.sleep(0.2)
    c.send("\x03")
    out = prompt(c)
    if "interrupted!" not in out:
        raise Fail("after Ctrl-C: %r" % out)
    out = enter(c, 'print(fl.capture(function(x) return x + 1 end, fl.ones(1)) ~= nil)')
    expect_in("true", out)
    out = enter(c, 'print(fl.compile(function(x) return x * 3 end)(fl.ones(2)):sum():item())')
    expect_in("6.0", out)
    finish(c)


@test("Ctrl-C during a slow compiler run stops it and the session goes on")
def _():
    cc = os.path.join(TMP, "slow-cc")
    with open(cc, "w") as f:
        f.write("#!/bin/sh\nsleep 60\nexec cc \"$@\"\n")
    os.chmod(cc, 0o755)
    cache = tempfile.mkdtemp(prefix="cache.", dir=TMP)
    c = spawn(extra={"CC": cc, "FUSELAB_CACHE_DIR": cache})
    prompt(c)
    enter(c, 'f = fl.compile(function(x) return (x * 3 + 1):exp() end)')
    c.send('print("compiling") y = f(fl.ones(4))\r')
    c.expect_exact("compiling\r\n")
    time.sleep(1.0)
    t0 = time.time()
    c.send("\x03")
    out = prompt(c)   # within the prompt's 5 s, not the compiler's 60
    if "interrupted!" not in out:
        raise Fail("after Ctrl-C: %r" % out)
    if time.time() - t0 > 5:
        raise Fail("the prompt came back after %.1f s" % (time.time() - t0))
    expect_in("true", enter(c, 'print(fl.capture(function(x) return x + 1 end, fl.ones(1)) ~= nil)'))
    finish(c)


@test("a compile longer than a second shows a progress line on the terminal, then erases it")
def _():
    cc = os.path.join(TMP, "slow2-cc")
    with open(cc, "w") as f:
        f.write("#!/bin/sh\nsleep 2\nexec cc \"$@\"\n")
    os.chmod(cc, 0o755)
    cache = tempfile.mkdtemp(prefix="cache.", dir=TMP)
    c = spawn(extra={"CC": cc, "FUSELAB_CACHE_DIR": cache})
    prompt(c)
    c.timeout = 30
    c.send('print(fl.compile(function(x) return (x * 5 + 1):exp() end)(fl.ones(4)):sum():item() > 0)\r')
    c.expect_exact("fl> ")
    raw = c.before
    if not re.search(r"compiling 1 kernel with slow2-cc: 1\.\d s", raw):
        raise Fail("no progress line in %r" % raw)
    if "\x1b[K" not in raw:
        raise Fail("the progress line was not erased: %r" % raw)
    expect_in("true", clean(raw.split("\x1b[K")[-1]).split("\n"))
    finish(c)


@test("an error in a first compiled call leaves capture working")
def _():
    c = spawn()
    prompt(c)
    out = enter(c, 'fl.compile(function(i, w) return fl.embedding(i, w) end)(fl.tensor{5}, fl.ones(3, 2))')
    if not any("out of range" in l for l in out):
        raise Fail("error output: %r" % out)
    out = enter(c, 'print(fl.capture(function(x) return x + 1 end, fl.ones(1)) ~= nil)')
    expect_in("true", out)
    finish(c)


@test("Ctrl-C at the prompt drops the typed line")
def _():
    c = spawn()
    prompt(c)
    c.send("garbage garbage")
    c.expect_exact("garbage garbage")  # readline has it: ^C must drop it
    c.send("\x03")
    prompt(c)
    expect_in("2", enter(c, "1+1"))
    finish(c)


@test("Ctrl-C at a ..> prompt drops the unfinished chunk")
def _():
    c = spawn()
    prompt(c)
    enter(c, "function g()", "..> ")
    c.send("\x03")
    prompt(c)
    expect_in("nil", enter(c, "g"))
    finish(c)


@test("Ctrl-D leaves with status 0")
def _():
    c = spawn()
    prompt(c)
    finish(c)


@test(":quit leaves with status 0")
def _():
    c = spawn()
    prompt(c)
    c.send(":quit\r")
    c.expect(pexpect.EOF)
    c.close()
    if c.exitstatus != 0:
        raise Fail("exit status %r" % c.exitstatus)


@test(":help lists the commands and topics; :help <topic>; unknown topic")
def _():
    c = spawn()
    prompt(c)
    out = "\n".join(enter(c, ":help"))
    for word in (":load", ":time", ":device", ":quit", "tensors", "compile"):
        if word not in out:
            raise Fail(":help lacks %r" % word)
    # (:help ops lists the op table's elementwise rows: fmod and remainder
    # were missing from a hand-written list)
    for topic, word in (("tensors", "fl.zeros"), ("ops", "matmul"), ("ops", " fmod"), ("ops", " remainder"),
                        ("ops", " asin acos atan"),
                        ("ops", "amax amin var argmax"), ("train", "backward"), ("train", "j:partition"),
                        ("llm", "load_pretrained"), ("llm", "step_compiles"),
                        ("repl", "Ctrl-C"), ("compile", "fl.compile")):
        if word not in "\n".join(enter(c, ":help " + topic)):
            raise Fail(":help %s lacks %r" % (topic, word))
    out = "\n".join(enter(c, ":help bogus"))
    if "tensors" not in out or "bogus" not in out:
        raise Fail(":help bogus: %r" % out)
    finish(c)


@test(":time on prints the wall time of each line; :time off stops it")
def _():
    c = spawn()
    prompt(c)
    enter(c, ":time on")
    out = enter(c, "1+1")
    if not any(re.fullmatch(r"time [0-9.]+ (us|ms|s) \(one run\)", l) for l in out):
        raise Fail("no time line in %r" % out)
    enter(c, ":time off")
    out = enter(c, "1+1")
    if any(l.startswith("time ") for l in out):
        raise Fail("time still printed: %r" % out)
    finish(c)


@test(":time EXPR prints a median with its interquartile range (fl.measure)")
def _():
    c = spawn()
    prompt(c)
    enter(c, "n = 0")
    out = enter(c, ":time n = n + 1")
    if not any(re.match(r"time [0-9.]+ ms \(IQR [0-9.]+-[0-9.]+, 20 runs\)( noisy: .+)?$", l)
               for l in out):
        raise Fail("no median line in %r" % out)
    out = enter(c, "n")
    expect_in("21", out)           # one warm-up run and twenty timed ones
    out = "\n".join(enter(c, ":time nosuch.field"))
    if "nosuch" not in out:
        raise Fail("an error in EXPR is not reported: %r" % out)
    finish(c)


@test(":load runs a file here; a failing or missing file is reported")
def _():
    good = os.path.join(TMP, "good.lua")
    bad = os.path.join(TMP, "bad.lua")
    with open(good, "w") as f:
        f.write("loaded_value = 99\n")
    with open(bad, "w") as f:
        f.write("local function h() error('bad file') end\nh()\n")
    c = spawn()
    prompt(c)
    enter(c, ":load " + good)
    expect_in("99", enter(c, "loaded_value"))
    out = enter(c, ":load " + bad)
    if not any("bad file" in l for l in out) or "stack traceback:" not in out:
        raise Fail(":load bad: %r" % out)
    out = enter(c, ":load " + os.path.join(TMP, "missing.lua"))
    if not any("cannot open" in l for l in out):
        raise Fail(":load missing: %r" % out)
    expect_in("1", enter(c, "1"))
    finish(c)


@test(":load model.onnx binds the global model, says so and prints it; then model2")
def _():
    src = os.environ.get("FUSELAB_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    onnx = os.path.join(src, "tests", "fuzz", "corpus_onnx", "mlp.onnx")
    c = spawn()
    prompt(c)
    out = enter(c, ":load " + onnx)
    if not any("onnx.Model 'mlp'" in l for l in out) or not any("MatMul x1" in l for l in out):
        raise Fail(":load model.onnx: %r" % out)
    expect_in("bound to model", out)
    expect_in("3", enter(c, "#model._nodes"))
    out = enter(c, ":load " + onnx)
    expect_in("bound to model2: model already holds a value "
              "(:load FILE as NAME picks the name)", out)
    expect_in("true", enter(c, "model ~= model2"))
    out = enter(c, ":load " + os.path.join(TMP, "missing.onnx"))
    if not any("missing.onnx" in l for l in out):
        raise Fail(":load missing.onnx: %r" % out)
    expect_in("1", enter(c, "1"))
    finish(c)


@test(":device names cpu; an unknown command is reported")
def _():
    c = spawn()
    prompt(c)
    out = enter(c, ":device")
    if not any(l.startswith("cpu") for l in out) or \
       not any(l.startswith("cuda") for l in out):
        raise Fail(":device: %r" % out)
    out = enter(c, ":frobnicate")
    if not any("unknown command ':frobnicate'" in l for l in out):
        raise Fail(":frobnicate: %r" % out)
    finish(c)


@test("history persists across two runs, multi-line chunks as one entry")
def _():
    state = tempfile.mkdtemp(dir=TMP)
    c = spawn(state=state)
    prompt(c)
    enter(c, "function hf()", "..> ")
    enter(c, "return 7", "..> ")
    enter(c, "end")
    enter(c, "hist_marker = 12345")
    finish(c)
    path = os.path.join(state, "fuselab", "history")
    if not os.path.exists(path):
        raise Fail("no history file at %s" % path)
    c = spawn(state=state)
    prompt(c)
    c.send("\x10\x10")  # Ctrl-P twice: the function, as one entry
    time.sleep(0.1)
    enter(c, "")
    c.send("\x10\x10")  # now: hist_marker line, after the recalled function
    time.sleep(0.1)
    enter(c, "")
    expect_in("12345", enter(c, "hist_marker"))
    expect_in("7", enter(c, "hf()"))
    finish(c)


@test("an unwritable history is reported once and the REPL works")
def _():
    c = spawn(state="/dev/null/nowhere")
    out = prompt(c)
    if "history will not be saved" not in out:
        raise Fail("no note about the history: %r" % out)
    expect_in("2", enter(c, "1+1"))
    finish(c)


@test("a FIFO where the history file goes never blocks the REPL")
def _():
    state = tempfile.mkdtemp(prefix="fifo-state.", dir=TMP)
    os.makedirs(os.path.join(state, "fuselab"))
    os.mkfifo(os.path.join(state, "fuselab", "history"))
    c = spawn(state=state)
    out = prompt(c)
    if "history will not be saved" not in out:
        raise Fail("no note about the FIFO: %r" % out)
    expect_in("2", enter(c, "1+1"))
    finish(c)


@test("Tab inside a string completes a file name")
def _():
    open(os.path.join(TMP, "weights_for_tab.npy"), "w").close()
    c = spawn()
    prompt(c)
    c.send('p = "%s/weights_for_t\t' % TMP)
    c.expect_exact('ab.npy"')  # the name, and readline closes the quote
    enter(c, "")
    expect_in(os.path.join(TMP, "weights_for_tab.npy"), enter(c, "p"))
    finish(c)


@test("-i script.lua runs the script, then the REPL sees its globals")
def _():
    script = os.path.join(TMP, "pre.lua")
    with open(script, "w") as f:
        f.write('from_script = 41\nprint("script ran")\n')
    c = spawn("-i", script)
    out = prompt(c)
    if "script ran" not in out:
        raise Fail("script output missing: %r" % out)
    expect_in("42", enter(c, "from_script + 1"))
    finish(c)


@test("NO_COLOR: no colour codes; without it the prompt is coloured")
def _():
    for colour in (False, True):
        c = spawn(colour=colour)
        prompt(c)
        enter(c, 'error("x")')
        finish(c)
        seen = bool(SGR.search("".join(c.transcript)))
        if seen != colour:
            raise Fail("colour=%s but colour codes %s" %
                       (colour, "seen" if seen else "absent"))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    for name, fn in TESTS:
        if pexpect is None:
            print("ok %d # SKIP pexpect missing (python3-pexpect): %s" % (n, name))
        else:
            try:
                fn()
                print("ok %d - %s" % (n, name))
            except Exception as e:  # one test's failure must not stop the rest
                print("not ok %d - %s" % (n, name))
                for l in ("%s: %s" % (type(e).__name__, e)).splitlines():
                    print("# " + l)
        sys.stdout.flush()
        n += 1


if __name__ == "__main__":
    try:
        main()
    finally:
        import shutil
        shutil.rmtree(TMP, ignore_errors=True)
