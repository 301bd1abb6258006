-- lua_driver.lua -- the review report as a user makes it, for
-- report_lua.sh: a model with a hostile parameter name compiled, called,
-- and fl.report(cm, ...) with measured timings and a checklist; also a
-- function with a graph break.  (Not named report_lua.lua: make would take
-- that as the source of report_lua.sh's test log.)
-- Usage: fuselab lua_driver.lua OUT.html OUT-break.html
local fl = fl or require "fuselab"
local out, out_break = arg[1], arg[2]
fl.manual_seed(3)

local model = fl.models.mlp{sizes = {32, 64, 10}, act = "gelu"}
local P = {["</script><script>alert(1)</script>"] = fl.randn(10, 10)}
local function f(x)
  return model(x):matmul(P["</script><script>alert(1)</script>"]):softmax(-1)
end
local x = fl.randn(8, 32)
local cm = fl.compile(f, {backend = "cpu"})
cm(x)
fl.report(cm, out, {
  inputs = {x}, calls = 5,
  checklist = {coverage = {supported = 5, total = 5, unsupported = {}}, cold_ms = 150,
               steady_ms = 0.02, eager_ms = 0.04, break_even_calls = 7500, cache_hit_rate = 1,
               recompiles = 0, max_abs_err = 3e-7, max_rel_err = 1e-6, fallbacks = 0,
               recommendation = "stable inference: compile"},
})

local function broken(v)
  local h = (v * 2):relu()
  local m = h:sum():item()
  return (h - m):exp()
end
local cb = fl.compile(broken, {backend = "cpu"})
cb(x)
fl.report(cb, out_break, {title = "a function with a graph break"})
