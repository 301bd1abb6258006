-- LuaRocks build of fuselab: the C module (require "fuselab") for Lua 5.4,
-- and the fuselab program.
--
--   luarocks make                              in a source checkout
--   luarocks build fuselab-0.1.0-1.rockspec    beside the tarball that
--                                              `make dist` writes
--
-- The autotools build does the work: the Debian packages that README.md
-- lists must be installed first (Lua 5.4 headers, Readline, Graphviz,
-- OpenBLAS, xxHash, cJSON, a C compiler with OpenMP).
rockspec_format = "3.0"
package = "fuselab"
version = "0.1.0-1"
source = {
  url = "fuselab-0.1.0.tar.gz",
  dir = "fuselab-0.1.0",
}
description = {
  summary = "A deep-learning compiler lab: torch.compile's pipeline rebuilt in C, scriptable in Lua",
  detailed = [[
fuselab rebuilds the pipeline behind PyTorch 2's torch.compile -- graph
capture, graph optimization, operator fusion, kernel generation, kernel
execution -- in C, and makes every step visible from Lua: tensors and
Torch7-style nn modules, fl.compile, capture into graphs, fusion with the
reason for each decision, generated C and CUDA kernels, Graphviz pictures.
]],
}
dependencies = {
  "lua >= 5.4",
}
build = {
  type = "command",
  -- a git checkout has no configure yet; a release tarball has
  build_command = [[
    if [ ! -x ./configure ]; then ./autogen.sh || exit 1; fi
    ./configure --prefix="$(PREFIX)" --bindir="$(BINDIR)" --with-lua-cmod="$(LIBDIR)" &&
    make
  ]],
  install_command = "make install",
}
