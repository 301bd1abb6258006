-- memory_picture.lua -- bytes alive at each step (p:memory(), fl.draw_memory,
-- the REPL's :memory): the curves' tops are p:stats()'s two peaks for every
-- pass order, the buffers named at a peak sum to it, the pictures carry
-- both curves and the peak labels, and bad input says what is wrong.
local t = require "tap"

local nn = fl.nn
local dir = t.tmpdir()
local FUSELAB = os.getenv("FUSELAB") or "fuselab"
local src = os.getenv("FUSELAB_SRC") or "."

local function check_plan(name, p)
  local m, s = p:memory(), p:stats()
  t.is(m.peak_before.bytes, s.peak_bytes_before, name .. ": peak op by op = stats' peak_bytes_before")
  t.is(m.peak_after.bytes, s.peak_bytes_after, name .. ": peak fused = stats' peak_bytes_after")
  t.is(m.before_graph, "captured", name .. ": op by op steps the captured graph")
  t.is(#m.after, s.kernels, name .. ": one fused step per kernel")
  local ok, top = true, {before = 0, after = 0}
  for _, side in ipairs{"before", "after"} do
    for i, st in ipairs(m[side]) do
      ok = ok and st.bytes >= 0 and st.step == i and type(st.name) == "string"
      if st.bytes > top[side] then top[side] = st.bytes end
    end
  end
  t.ok(ok, name .. ": every step numbered, named, bytes >= 0")
  t.ok(top.before == m.peak_before.bytes and top.after == m.peak_after.bytes,
       name .. ": each peak is its curve's top")
  for _, k in ipairs{"peak_before", "peak_after"} do
    local sum = 0
    for _, b in ipairs(m[k].buffers) do sum = sum + b.bytes end
    t.is(sum, m[k].bytes, name .. ": the buffers alive at " .. k .. " sum to it")
  end
  return m
end

local mlp = fl.models.mlp{sizes = {64, 256, 64}}:eval()
local gm = fl.capture(mlp, fl.randn(32, 64))
local blk = nn.TransformerBlock(64, 4):eval()
local gt = fl.capture(blk, fl.randn(1, 16, 64))
local cnn = fl.models.cnn{channels = {3, 16, 32}}:eval()
local gc = fl.capture(cnn, fl.randn(1, 3, 32, 32))
for _, c in ipairs{{"mlp", gm}, {"transformer block", gt}, {"cnn", gc}} do
  check_plan(c[1] .. " fuse", c[2]:fuse())
  check_plan(c[1] .. " decompose:fuse", c[2]:decompose{quiet = true}:fuse())
  check_plan(c[1] .. " decompose:optimize:fuse",
             c[2]:decompose{quiet = true}:optimize{quiet = true}:fuse())
end

local r50 = fl.load_onnx(src .. "/examples/models/resnet50.onnx")
local gr = fl.capture(r50, fl.randn(1, 3, 224, 224))
local pr = gr:decompose{quiet = true}:optimize{quiet = true}:fuse()
local mr = check_plan("resnet-50", pr)
t.ok(#mr.before > 300, "resnet-50: hundreds of steps op by op (" .. #mr.before .. ")")

-- the pictures
local p = gt:decompose{quiet = true}:optimize{quiet = true}:fuse()
local svg = fl.draw_memory(p, dir .. "/mem.svg")
t.is(svg, dir .. "/mem.svg", "draw_memory returns the path")
local text = t.slurp(dir .. "/mem.svg") or ""
t.ok(text:find("op by op", 1, true) and text:find("fused", 1, true), "the svg names both curves")
t.ok(text:find("peak " .. fl._bytes_str(p:stats().peak_bytes_after), 1, true),
     "the svg labels the fused peak with its bytes")
fl.draw_memory(pr, dir .. "/r50.png")
local png = t.slurp(dir .. "/r50.png") or ""
t.is(png:sub(1, 8), "\137PNG\r\n\26\n", "the png has PNG's magic")
local w = png:byte(17) * 2^24 + png:byte(18) * 2^16 + png:byte(19) * 2^8 + png:byte(20)
t.ok(w >= 1800 and w <= 2600, "the png is about 1850 px wide, readable on a 1920-px projector (" .. w .. ")")
fl.draw_memory(gm, dir .. "/g.dot", {scale = "projector"})
t.ok((t.slurp(dir .. "/g.dot") or ""):find("neato -n", 1, true), "a Graph draws (.dot, projector)")
fl.draw_memory(p:codegen("cpu"), dir .. "/k.svg")
t.ok(t.slurp(dir .. "/k.svg") ~= nil, "a Program draws")
local cm = fl.compile(mlp)
t.raises(function() fl.draw_memory(cm, dir .. "/never.svg") end, "has not run yet",
         "a compiled function never called: call it once first")
cm(fl.randn(32, 64))
fl.draw_memory(cm, dir .. "/cm.svg")
t.ok(t.slurp(dir .. "/cm.svg") ~= nil, "a compiled function draws its plan")

-- the text
local s = p:memory_text()
t.ok(s:find("op by op", 1, true) and s:find("fused", 1, true) and s:find("<- peak", 1, true),
     "p:memory_text() states both peaks and marks them in the steps")

-- bad input
t.raises(function() fl.draw_memory(42, dir .. "/x.svg") end, "cannot draw the memory of a number",
         "a number is refused")
t.raises(function() fl.draw_memory(p, "/nonexistent-dir/x.svg") end, "draw_memory: .*nonexistent%-dir",
         "an unwritable path says draw_memory")
t.raises(function() fl.draw_memory(p, dir .. "/x.gif") end, "unknown picture format",
         "an unknown extension is refused")
t.raises(function() fl.draw_memory(p) end, "file name", "no path is refused")
t.raises(function() fl.draw_memory(p, dir .. "/x.svg", {colour = 1}) end, "colour",
         "an unknown option is refused")

-- the REPL's :memory
local f = assert(io.open(dir .. "/in.txt", "w"))
f:write("m = fl.models.mlp{sizes = {64, 256, 64}}:eval()\n",
        "p = fl.capture(m, fl.randn(32, 64)):fuse()\n", ":memory p\n", "p\n", ":memory\n",
        ":memory 42\n")
f:close()
local h = io.popen("'" .. FUSELAB .. "' -i < '" .. dir .. "/in.txt' 2>&1")
local out = h:read("a")
h:close()
local _, n = out:gsub("op by op %(the captured graph%): peak 64 KiB", "")
t.is(n, 2, ":memory p and :memory (the last result) print the peaks")
t.ok(out:find("cannot count the memory of a number", 1, true), ":memory 42 says what it cannot count")

t.done()
