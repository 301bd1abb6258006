-- autograd64.lua -- autograd.lua's gradient checks in float64: every
-- derivative rule of the op table against central finite differences in
-- double, as PyTorch's gradcheck does (the tolerances are stated there).
AUTOGRAD_DTYPE = "float64"
dofile((os.getenv("FUSELAB_SRC") or "..") .. "/tests/lua/autograd.lua")
