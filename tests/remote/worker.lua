-- worker.lua -- one "machine" of tests/remote/remote.sh: compiles three
-- functions (three kernel objects), checks each against eager, and prints
-- one line of counts for the shell to read.
-- Env: WORKER_KILL  a pid killed (SIGKILL) after the first function, to
-- lose Redis mid-run; WORKER_BACKEND=cuda  three functions on the cuda
-- backend instead (NVRTC images, on a GPU or the emulator).
fl.manual_seed(7)
local fns = {
  fl.models.mlp{sizes = {16, 32, 4}},
  function(x) return (x * 2 + 1):relu() end,
  function(x) return (x:exp() + x):sum(1) end,
}
local backend = os.getenv("WORKER_BACKEND") or "cpu"
if backend == "cuda" then
  fns[1] = function(x) return x:tanh() * 3 end
end
local t0 = fl.now()
local ok, remote_hits = true, 0
for i, f in ipairs(fns) do
  local x = fl.randn(8, 16)
  local cm = fl.compile(f, {backend = backend})
  local want = f(x)
  if backend == "cuda" then x = x:cuda() end
  local got = cm(x)
  if backend == "cuda" then got = got:cpu() end
  ok = ok and fl.allclose(got, want, 1e-5, 1e-6)
  remote_hits = remote_hits + cm:stats().remote_cache_hits
  if i == 1 and os.getenv("WORKER_KILL") then os.execute("kill -9 " .. os.getenv("WORKER_KILL")) end
end
local ms = (fl.now() - t0) * 1000
local ci = fl.cache_info()
local r = ci.remote or {}
print(("RESULT ok=%s misses=%d disk=%d stats_remote=%d rhits=%d rmisses=%d writes=%d rejected=%d errors=%d enabled=%s ms=%.0f why=%s"):format(
  tostring(ok), ci.misses, ci.disk_hits, remote_hits, r.hits or -1, r.misses or -1, r.writes or -1,
  r.rejected or -1, r.errors or -1, tostring(r.enabled), ms, (r.why or ""):gsub("%s", "_")))
