-- index.lua -- x[i] as in Torch7: the i-th slice along dim 1 (1-based,
-- negative from the end) is a view sharing x's storage; a 1-D tensor
-- gives its element as a Lua number; x[i] = v fills or copies into the
-- slice; out of range is an error naming the size; fields and methods
-- are untouched; and x[i] traces inside fl.compile like narrow, x[-1]
-- specializing a symbolic dim (the last slice depends on its size).
local fl = fl or require "fuselab"
local t = require "tap"

local x = fl.arange(6):reshape(2, 3)
t.is(x[1]:tolist(), {0, 1, 2}, "x[1] is the first row")
t.is(x[-1]:tolist(), {3, 4, 5}, "x[-1] is the last row")
t.is(x[2].shape, {3}, "a slice of a 2-D tensor is 1-D")
t.is(x[2][3], 5, "x[2][3] is the element, a Lua value")
t.is(math.type(x[2][3]), "integer", "an int64 element is a Lua integer")
t.is(fl.tensor{1.5, 2.5}[2], 2.5, "a float element is a number")
t.is(fl.tensor{true, false}[1], true, "a bool element is a boolean")
t.is(fl.zeros(4, 2, 3)[4].shape, {2, 3}, "a slice of a 3-D tensor is 2-D")
t.is(x[2.0]:tolist(), {3, 4, 5}, "an integral float index is an integer")

-- fields and methods are as before
t.is(x.shape, {2, 3}, "x.shape")
t.is(x.dtype, "int64", "x.dtype")
t.is(x.device, "cpu", "x.device")
t.is(x:dim(), 2, "methods still resolve")
t.is(x.no_such_field, nil, "an unknown field is nil")
t.is(x[true], nil, "a key that is neither a name nor a number is nil")

-- views: writing through a slice writes x
local y = fl.zeros(2, 3)
y[1]:fill_(7)
t.is(y:tolist(), {{7, 7, 7}, {0, 0, 0}}, "a slice is a view")
y[2] = 4
t.is(y:tolist(), {{7, 7, 7}, {4, 4, 4}}, "x[i] = number fills the slice")
y[1] = fl.tensor{1, 2, 3}
t.is(y:tolist(), {{1, 2, 3}, {4, 4, 4}}, "x[i] = tensor copies into the slice")
y[-1][2] = 9
t.is(y:tolist(), {{1, 2, 3}, {4, 9, 4}}, "x[i][j] = v sets one element")
local z = fl.ones(3)
z[2] = 0
t.is(z:tolist(), {1, 0, 1}, "1-D: x[i] = v sets the element")
local tr = fl.arange(6):reshape(2, 3):transpose(1, 2)
tr[1] = 8
t.is(tr:tolist(), {{8, 8}, {1, 4}, {2, 5}}, "a non-contiguous view is indexed by its own layout")

-- errors
t.raises(function() return x[3] end, "x%[3%] is out of range for dim 1 of size 2", "past the end")
t.raises(function() return x[0] end, "x%[0%] is out of range", "0 is not an index (1-based)")
t.raises(function() return x[-3] end, "x%[%-3%] is out of range.*%-2%.%.%-1", "too far from the end")
t.raises(function() return x[1.5] end, "takes an integer", "a fraction")
t.raises(function() return fl.tensor(3)[1] end, "0%-d tensor", "a 0-d tensor has no slices")
t.raises(function() x[1] = "a" end, "takes a number or a tensor, got string", "assigning a string")
t.raises(function() x[5] = 1 end, "out of range", "assigning out of range")
t.raises(function() x.shape = {1} end, "cannot assign field 'shape'", "fields stay read-only")
t.raises(function() y[1] = fl.ones(4) end, "copy_", "a tensor that does not fit the slice")

-- inside a compiled function, x[i] is captured as narrow + squeeze
fl.manual_seed(0)
local f = fl.compile(function(a) return a[2] * 2 + a[-1] end)
local a = fl.rand(3, 4)
local want = a[2] * 2 + a[3]
t.ok(fl.allclose(f(a), want), "compiled x[i] matches eager")
t.ok(fl.allclose(f(a), want), "and again from the cache")
t.is(f:stats().graph_breaks, 0, "x[i] does not break the graph")

-- x[-1] on a dim that becomes symbolic: the last slice of each size (it
-- was the example's last row, the position baked in), as narrow(1, -1, 1)
for _, dyn in ipairs{true, false} do
  local last = fl.compile(function(a) return a[-1] * 1 end, {dynamic = dyn or nil})
  local nar = fl.compile(function(a) return a:narrow(1, -1, 1) * 1 end, {dynamic = dyn or nil})
  for _, rows in ipairs{3, 5, 7} do
    local a = fl.arange(rows * 2):reshape(rows, 2):to("float32")
    t.is(last(a):tolist(), {2 * rows - 2, 2 * rows - 1},
         ("compiled x[-1], %s, %d rows"):format(dyn and "dynamic=true" or "automatic", rows))
    t.is(nar(a):tolist(), {{2 * rows - 2, 2 * rows - 1}},
         ("compiled narrow(1, -1, 1), %s, %d rows"):format(dyn and "dynamic=true" or "automatic", rows))
  end
end

-- a symbolic size as the index (x[x.shape[1]] under dynamic=true): its
-- value now, guarded
local lastrow = fl.compile(function(a) return a[a.shape[1]] * 1 end, {dynamic = true})
for _, rows in ipairs{3, 5} do
  t.is(lastrow(fl.arange(rows * 2):reshape(rows, 2):to("float32")):tolist(), {2 * rows - 2, 2 * rows - 1},
       ("compiled x[x.shape[1]], %d rows"):format(rows))
end

t.done()
