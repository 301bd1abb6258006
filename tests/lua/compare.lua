-- compare.lua -- what the tests that check every path against the
-- reference interpreter share (vision.lua, movement.lua, matmul.lua).
--   local C = require "compare"
--   local o = C.run(cases, width, epilogue, cuda)   C.check(cases, o, agree, bad, epi)
--   C.rerun(env, what, says, key)
local fl = fl or require "fuselab"
local t = require "tap"

local M = {}

-- Runs one function holding every case: eager, on the reference, compiled
-- for the CPU and, where cuda, compiled for CUDA on copies of the inputs
-- moved there.  A case is {what, inputs, fn, ...}: inputs holds at most
-- width tensors, nil for one left out (fn gets the nil in its place).
-- Outputs 2i - 1 and 2i of each path are fn's result for case i and
-- epilogue of it (fused after the op when compiled).  Returns {eager =,
-- ref =, cpu =, cuda =} (no cuda without a device), lists of outputs.
function M.run(cases, width, epilogue, cuda)
  local flat, at = {}, {}
  for i, c in ipairs(cases) do
    at[i] = #flat
    for j = 1, width do if c[2][j] then flat[#flat + 1] = c[2][j] end end
  end
  local function f(...)
    local xs, outs = {...}, {}
    for i, c in ipairs(cases) do
      local a, k = {}, 0
      for j = 1, width do
        if c[2][j] then k = k + 1; a[j] = xs[at[i] + k] end
      end
      local y = c[3](table.unpack(a, 1, width))
      outs[#outs + 1] = y
      outs[#outs + 1] = epilogue(y)
    end
    return table.unpack(outs)
  end
  local o = {}
  o.eager = {f(table.unpack(flat))}
  local g = fl.capture(f, table.unpack(flat))
  o.ref = {g:run_reference(table.unpack(flat))}
  o.cpu = {fl.compile(f, {backend = "cpu"})(table.unpack(flat))}
  if cuda then
    local on = {}
    for i, x in ipairs(flat) do on[i] = x:cuda() end
    o.cuda = {fl.compile(f, {backend = "cuda"})(table.unpack(on))}
  end
  return o
end

-- Each case's outputs of run on every path against the reference's:
-- agree(got, want, case) says whether they do; bad(kind, case, got, want)
-- is told each that does not, kind "eager", "cpu", "cuda" or epi (the
-- epilogue's outputs, CPU then CUDA).
function M.check(cases, o, agree, bad, epi)
  for i, c in ipairs(cases) do
    local function cmp(kind, outs, k)
      if not agree(outs[k], o.ref[k], c) then bad(kind, c, outs[k], o.ref[k]) end
    end
    cmp("eager", o.eager, 2 * i - 1)
    cmp("cpu", o.cpu, 2 * i - 1)
    cmp(epi, o.cpu, 2 * i)
    if o.cuda then
      cmp("cuda", o.cuda, 2 * i - 1)
      cmp(epi, o.cuda, 2 * i)
    end
  end
end

-- This test file again in a child fuselab under env ("NAME=value"): two
-- checks, that every case passes there (its failures shown as
-- diagnostics) and that fl.blas_info()[key] contains says.  what names
-- the path the child runs on.
function M.rerun(env, what, says, key)
  local exe = os.getenv("FUSELAB") or arg[-1]
  local script = arg and arg[0]
  local p = assert(io.popen(("%s %s %s 2>&1"):format(env, exe, script)))
  local out = p:read("a")
  p:close()
  local fails = 0
  for line in out:gmatch("[^\n]+") do if line:match("^not ok") then fails = fails + 1; t.diag(line) end end
  t.ok(out:match("\nok") and fails == 0, "the same cases on " .. what .. " (" .. env .. "): " .. fails .. " failed")
  t.ok(out:find(says, 1, true) ~= nil, "and fl.blas_info()." .. key .. " says so")
end

return M
