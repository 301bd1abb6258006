-- tour.lua -- the guided tour of fuselab, run by README's Quick start.
--
-- One small model goes through every stage of the pipeline, the way
-- torch.compile takes a PyTorch model: eager run -> capture into a graph
-- -> decompose -> optimize -> fuse (with the planner's reasons) ->
-- generated C -> compiled run, measured against eager -> pictures and a
-- review report -> the go-live checklist.  Each section prints what it
-- shows; files go to the folder named at the start.
--
-- Run it yourself:  fuselab examples/tour.lua [folder]     (default ./fuselab-tour)
-- Then the lessons in examples/lessons/ (the tour ends with their list), or
-- :help lesson 1 in the REPL.

local fl = fl or require "fuselab"
local nn = nn or fl.nn

local out_dir = arg and arg[1] or "fuselab-tour"

local function section(title)
  print(("\n== %s %s"):format(title, ("="):rep(math.max(0, 70 - #title))))
end

-- The median of n calls of f(...) with its spread (fl.measure: the
-- interquartile range, and "noisy" when it is wide or the machine busy).
local function timed(n, f, ...)
  return fl.measure(f, {args = {...}, runs = n})
end

-- The lessons beside this file: every examples/lessons/NN_*.lua, read from
-- the folder, so a new lesson is listed without editing the tour.  The
-- folder and the file names, in order; no names when it cannot be read.
local function lessons()
  local src = debug.getinfo(1, "S").source
  local dir = (src:match("^@(.+)/[^/]*$") or ".") .. "/lessons"
  local names = {}
  local ls = io.popen(("ls '%s' 2>/dev/null"):format((dir:gsub("'", "'\\''"))))
  if ls then
    for name in ls:lines() do
      if name:match("^%d%d_.+%.lua$") then names[#names + 1] = name end
    end
    ls:close()
  end
  table.sort(names)
  return dir, names
end

local function write_file(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local t_start = fl.now()

section("0. Tensors, eager, as in PyTorch")
local x0 = fl.tensor{{1.0, 2, 3}, {4, 5, 6}}
print("x = fl.tensor{{1.0,2,3},{4,5,6}};  x:softmax(-1)   (dims are 1-based; -1 is the last)")
print(x0:softmax(-1))
local ok, msg = pcall(function() return fl.ones(64, 128):matmul(fl.ones(64, 10)) end)
print("errors name what was wrong:  " .. (ok and "no error?" or msg))

section("1. A model")
fl.manual_seed(0)
-- A transformer's feed-forward block: Linear -> GELU -> Linear -> LayerNorm.
local model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64))
model:eval()
model:requires_grad_(false)   -- serving, not training: eager keeps no autograd tape
local x = fl.randn(32, 64)
print(model)
print(("input x: %s %s"):format(x.dtype, "[" .. table.concat(x.shape, ",") .. "]"))

section("2. Eager: each op runs as Lua reaches it")
local y_eager = model(x)
local eager_t = timed(50, model, x)
print(("model(x) -> %s, %s per call"):format("[" .. table.concat(y_eager.shape, ",") .. "]", eager_t))

section("3. Capture: run it once, record a graph")
print("g = fl.capture(model, x)   -- every op becomes a node; weights become params")
local g = fl.capture(model, x)
print(g)

section("4. Decompose: composite ops into primitives")
print("g2 = g:decompose()   -- linear, gelu, layer_norm become the ops kernels are made of")
local g2 = g:decompose()
print(("%d ops -> %d ops (print(g2) lists them)"):format(#g:ops(), #g2:ops()))

section("5. Optimize: CSE, dead code, folding, algebra, linear")
local g3 = g2:optimize()
print(("%d ops after optimize"):format(#g3:ops()))

section("6. Fuse: which ops share a kernel, and why")
print("p = g3:fuse{explain=true}   -- every decision with its reason and the bytes it saves")
local p = g3:fuse{explain = true}
local ps = p:stats()

section("7. Generate code: one C function per kernel")
local k = p:codegen("cpu")
local src = k:source()
-- an excerpt: the header comment of each kernel (what it fuses)
print(("k = p:codegen(\"cpu\") -- %d lines of C; print(k) shows all.  The kernels' headers:"):format(
  select(2, src:gsub("\n", ""))))
for header in src:gmatch("\n(/%* k%d+: .-%*/)") do print(header) end
local t0 = fl.now()
k:compile()
print(("compiled with %s in %.0f ms (from %s)"):format(fl.cache_info().compiler,
  (fl.now() - t0) * 1e3, k:stats().how))

section("8. Run compiled, and measure")
local y_prog = k:run(x)
print(("k:run(x) matches eager: %s"):format(tostring(fl.allclose(y_prog, y_eager, 1e-4, 1e-5))))
print("cm = fl.compile(model) -- what you use: capture, fuse, compile on the first call; guards after")
local cm = fl.compile(model)
t0 = fl.now()
cm(x)
local first_ms = (fl.now() - t0) * 1e3
local compiled_t = timed(50, cm, x)
eager_t = timed(50, model, x)   -- again, next to it: the same machine state for both
print(("first call %.1f ms (one run: capture, %s), then per call:"):format(first_ms,
  cm:stats().first_call_warm and "no compile: k:compile() above made these kernels, so warm" or "compile: cold"))
print(("  compiled %s\n  eager    %s"):format(compiled_t, eager_t))
print(("measured now on this machine: %s"):format(
  fl.compare_times(compiled_t, eager_t, {names = {"compiled", "eager"}}).text))
print(("memory traffic per call %.1f KiB -> %.1f KiB, %d buffers -> %d, %d kernels for %d ops"):format(
  ps.bytes_before / 1024, ps.bytes_after / 1024, ps.buffers_before, ps.buffers_after, ps.kernels, ps.ops))

section("9. Pictures and a review report")
os.execute(("mkdir -p '%s'"):format(out_dir:gsub("'", "'\\''")))
write_file(out_dir .. "/graph.txt", tostring(g) .. "\n")
write_file(out_dir .. "/graph_decomposed.txt", tostring(g3) .. "\n")
write_file(out_dir .. "/kernels.c", src)
local written = {"graph.txt", "graph_decomposed.txt", "kernels.c"}
if fl.draw then
  local pics = {
    {"graph.svg", function(path) fl.draw(g, path) end, "the captured graph"},
    {"plan.svg", function(path) fl.draw(p, path) end, "the fused plan: one cluster per kernel"},
    {"compare.svg", function(path) fl.draw_compare(g3, p, path) end, "before and after fusion"},
    {"review.html", function(path) fl.report(cm, path) end, "the review report: graphs, kernels, code, stats"},
  }
  for _, pic in ipairs(pics) do
    local okp, err = pcall(pic[2], out_dir .. "/" .. pic[1])
    if okp then
      written[#written + 1] = pic[1]
      print(("  %-14s %s"):format(pic[1], pic[3]))
    else
      print(("  %-14s not written: %s"):format(pic[1], tostring(err)))
    end
  end
else
  print("(pictures: not in this build)")
end
print(("written to %s/: %s"):format(out_dir, table.concat(written, ", ")))

section("10. Should this model be compiled? The go-live checklist")
print("fl.checklist(model, {inputs = {x}})   -- measured, not believed; with changing shapes: lesson 06")
fl.checklist(model, {inputs = {x}, name = "the feed-forward block, batch 32"})

section("Next")
print(("The tour took %.1f s.  Next:"):format(fl.now() - t_start))
local lesson_dir, lesson_names = lessons()
if #lesson_names > 0 then
  print("  lessons   one claim each, measured on this machine; :help lesson N in the REPL")
  print(("            says what each shows.  Run one: fuselab %s/FILE"):format(lesson_dir))
  for _, name in ipairs(lesson_names) do print("              " .. name) end
else
  print("  lessons   examples/lessons/ in the source tree (:help lesson in the REPL lists them)")
end
print("  training  fuselab examples/train_digits.lua: autograd, cross-entropy and AdamW on")
print("            real handwritten digits, 98 % right in a second; :help backward, :help AdamW")
print("  REPL      fuselab     then :help")
