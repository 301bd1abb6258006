-- onnx_image.lua -- ONNX's ImageDecoder (io/image.c through fl.load_onnx):
-- each format against the pixels Pillow decodes (tests/data/image, written
-- by its make.py), images encoded here by hand (BMP, PNM, PNG), each
-- pixel_format, and the errors hostile bytes must give: truncated,
-- corrupt, absurd sizes, inputs of the wrong dtype or rank.
local t = require "tap"
local P = require "onnx_proto"

local src = os.getenv("FUSELAB_SRC") or "."
local data = src .. "/tests/data/image/"
local want = dofile(data .. "expected.lua")
local dir = t.tmpdir()

local models = {}
local function decoder(pf, dtype, dims)
  local key = tostring(pf) .. (dtype or "") .. #(dims or {})
  if not models[key] then
    models[key] = fl.load_onnx(P.write(dir .. "/img" .. #dir .. key:gsub("%W", "_") .. ".onnx", P.model{opset = 20,
      nodes = {{op = "ImageDecoder", inputs = {"x"}, outputs = {"y"}, name = "dec", attrs = pf and {pixel_format = pf} or nil}},
      inputs = {{name = "x", dtype = dtype or "uint8", dims = dims or {"N"}}}, outputs = {{name = "y", dtype = "uint8"}}}))
  end
  return models[key]
end

local function bytes_of(s)
  local l = {}
  for i = 1, #s do l[i] = s:byte(i) end
  if #l == 0 then return fl.zeros({0}, {dtype = "int64"}) end
  return fl.tensor(l, {dtype = "int64"})
end

local function flat(y)
  return y:reshape({-1}):tolist()
end

local function read(name) return assert(t.slurp(data .. name)) end

-- Each library is optional at build time: a format this build lacks is
-- refused naming it, and its checks are skipped.
local have = {}
for ext, file in pairs({jpg = "rgb.jpg", png = "rgb.png", tif = "rgb.tif", webp = "rgb.webp", jp2 = "rgb.jp2"}) do
  local ok, e = pcall(decoder("RGB"), bytes_of(read(file)))
  have[ext] = ok or not tostring(e):find("this build has no", 1, true)
  if not have[ext] then t.diag(file .. ": " .. tostring(e)) end
end
local function needs(ext, n, fn)
  if have[ext] then fn() else t.skip("no " .. ext .. " library in this build", n) end
end

-- ---- each format, each pixel_format, against Pillow's pixels -------------
local names = {"rgb.jpg", "gray.jpg", "rgb.png", "palette.png", "rgb16.png", "rgb.tif", "rgb.webp", "rgb.jp2"}
for _, name in ipairs(names) do
  local x = bytes_of(read(name))
  for _, pf in ipairs({"RGB", "BGR", "Grayscale"}) do
    if not have[name:match("%.(%w+)$")] then t.skip("no library for " .. name, 2) goto next end
    local e = want[name][pf]
    local ok, y = pcall(decoder(pf), x)
    if not ok then
      t.ok(false, name .. " " .. pf .. ": " .. tostring(y))
    else
      local exp = {}
      for i = 1, #e do exp[i] = e[i] end
      t.is(y.shape, e.shape, name .. " " .. pf .. ": shape")
      t.is(flat(y), exp, name .. " " .. pf .. ": Pillow's pixels exactly")
    end
    ::next::
  end
end
-- the default pixel_format is RGB
local ppm = bytes_of("P6 2 1 255\n\1\2\3\4\5\6")
t.is(flat(decoder(nil)(ppm)), {1, 2, 3, 4, 5, 6}, "no pixel_format attribute: RGB")

-- ---- images encoded here ---------------------------------------------------
local px = {{{255, 0, 0}, {0, 255, 0}, {0, 0, 255}},
            {{10, 20, 30}, {200, 100, 50}, {7, 8, 9}}}      -- 2 rows of 3
local rgb_flat, bgr_flat, gray_flat = {}, {}, {}
for _, row in ipairs(px) do
  for _, p in ipairs(row) do
    for c = 1, 3 do rgb_flat[#rgb_flat + 1] = p[c] end
    for c = 3, 1, -1 do bgr_flat[#bgr_flat + 1] = p[c] end
    gray_flat[#gray_flat + 1] = (p[1] * 19595 + p[2] * 38470 + p[3] * 7471 + 0x8000) >> 16
  end
end

local function le32(n) return string.pack("<I4", n) end
local function bmp(w, h, rows, opts)
  opts = opts or {}
  local stride = (w * 3 + 3) & ~3
  local body = {}
  local order = {}
  for y = 1, #rows do order[#order + 1] = y end
  local top_down = opts.top_down
  for i = 1, #rows do
    local row = rows[top_down and i or #rows + 1 - i]
    local s = {}
    for _, p in ipairs(row) do s[#s + 1] = string.char(p[3], p[2], p[1]) end
    local r = table.concat(s)
    body[#body + 1] = r .. string.rep("\0", stride - #r)
  end
  local pix = table.concat(body)
  local ih = top_down and -h or h
  return "BM" .. le32(54 + #pix) .. le32(0) .. le32(54) .. le32(40) .. string.pack("<i4i4", w, ih)
    .. string.pack("<I2I2", 1, 24) .. le32(0) .. le32(#pix) .. le32(2835) .. le32(2835) .. le32(0) .. le32(0) .. pix
end

local function raw(rows, c)
  local s = {}
  for _, row in ipairs(rows) do
    for _, p in ipairs(row) do s[#s + 1] = c == 1 and string.char(p) or string.char(p[1], p[2], p[3]) end
  end
  return table.concat(s)
end

-- PNG with stored (uncompressed) deflate blocks: CRC-32 and Adler-32 here
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do c = (c & 1) ~= 0 and (0xEDB88320 ~ (c >> 1)) or (c >> 1) end
  crc_table[i] = c
end
local function crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do c = crc_table[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8) end
  return c ~ 0xFFFFFFFF
end
local function adler32(s)
  local a, b = 1, 0
  for i = 1, #s do a = (a + s:byte(i)) % 65521; b = (b + a) % 65521 end
  return (b << 16) | a
end
local function chunk(kind, d) return string.pack(">I4", #d) .. kind .. d .. string.pack(">I4", crc32(kind .. d)) end
local function png(w, h, ctype, scan, ihdr_w, ihdr_h)
  local z = "\x78\x01" .. "\x01" .. string.pack("<I2I2", #scan, (~#scan) & 0xFFFF) .. scan .. string.pack(">I4", adler32(scan))
  return "\x89PNG\r\n\x1a\n" .. chunk("IHDR", string.pack(">I4I4BBBBB", ihdr_w or w, ihdr_h or h, 8, ctype, 0, 0, 0))
    .. chunk("IDAT", z) .. chunk("IEND", "")
end
local function scanlines(rows, c)
  local s = {}
  for _, row in ipairs(rows) do s[#s + 1] = "\0" .. raw({row}, c) end
  return table.concat(s)
end

local grays = {{0, 128, 255}, {1, 2, 3}}
local gray_px_flat, gray_rgb_flat = {}, {}
for _, row in ipairs(grays) do
  for _, g in ipairs(row) do
    gray_px_flat[#gray_px_flat + 1] = g
    for _ = 1, 3 do gray_rgb_flat[#gray_rgb_flat + 1] = g end
  end
end

local made = {
  {"BMP bottom-up", bmp(3, 2, px)},
  {"BMP top-down", bmp(3, 2, px, {top_down = true})},
  {"PNM P6 with a comment", "P6\n# a comment\n3 2\n255\n" .. raw(px, 3)},
}
if have.png then made[#made + 1] = {"PNG RGB", png(3, 2, 2, scanlines(px, 3))} else t.skip("no libpng", 4) end
for _, m in ipairs(made) do
  local x = bytes_of(m[2])
  t.is(decoder("RGB")(x).shape, {2, 3, 3}, m[1] .. ": shape [H, W, 3]")
  t.is(flat(decoder("RGB")(x)), rgb_flat, m[1] .. ": RGB pixels")
  t.is(flat(decoder("BGR")(x)), bgr_flat, m[1] .. ": BGR pixels")
  t.is(flat(decoder("Grayscale")(x)), gray_flat, m[1] .. ": Grayscale is Pillow's L of RGB")
end
local grays_made = {{"PNM P5", "P5 3 2 255\n" .. raw(grays, 1)}}
if have.png then grays_made[2] = {"PNG gray", png(3, 2, 0, scanlines(grays, 1))} else t.skip("no libpng", 3) end
for _, m in ipairs(grays_made) do
  local x = bytes_of(m[2])
  local g = decoder("Grayscale")(x)
  t.is(g.shape, {2, 3, 1}, m[1] .. ": Grayscale shape [H, W, 1]")
  t.is(flat(g), gray_px_flat, m[1] .. ": Grayscale is the stored gray")
  t.is(flat(decoder("RGB")(x)), gray_rgb_flat, m[1] .. ": RGB repeats the gray")
end

-- ---- compiled: a graph break where the bytes are read; capture refuses -----
local pngx = bytes_of("P6 2 1 255\n" .. raw({{{1, 2, 3}, {4, 5, 6}}}, 3))
local cm = fl.compile(decoder("BGR"), {backend = "cpu"})
t.is(flat(cm(pngx)), flat(decoder("BGR")(pngx)), "fl.compile: the same pixels (through a graph break)")
t.is(flat(cm(bytes_of(bmp(3, 2, px)))), bgr_flat, "fl.compile: another image, another shape")
t.raises(function() fl.capture(decoder("RGB"), pngx) end,
  "node 'dec' %(ImageDecoder.*computed from graph inputs under capture.*unsupported",
  "fl.capture refuses it cleanly, naming the node")

-- ---- hostile bytes: clean errors naming the node -----------------------------
local NODE = "node 'dec' %(ImageDecoder, opset 20%)"
local function err_of(s, pf)
  local ok, e = pcall(decoder(pf or "RGB"), bytes_of(s))
  return ok, e
end
t.raises(function() decoder("RGB")(bytes_of("hello, world")) end, NODE .. ": not an image", "unknown bytes")
t.raises(function() decoder("RGB")(bytes_of("")) end, NODE .. ": not an image", "no bytes")
needs("png", 1, function() t.raises(function() decoder("RGB")(bytes_of(read("rgba.png"))) end,
  NODE .. ": PNG: an alpha channel.*unsupported", "RGBA PNG: unsupported") end)
needs("webp", 1, function() t.raises(function() decoder("RGB")(bytes_of(read("rgba.webp"))) end,
  NODE .. ": WebP: an alpha channel.*unsupported", "WebP with alpha: unsupported") end)
needs("jpg", 1, function() t.raises(function() decoder("RGB")(bytes_of(read("cmyk.jpg"))) end,
  NODE .. ": JPEG: CMYK.*unsupported", "CMYK JPEG: unsupported") end)
t.raises(function() decoder("RGB")(bytes_of("P6 3 2 15\n" .. raw(px, 3))) end, NODE .. ": PNM: maxval 15.*unsupported",
  "PNM maxval other than 255: unsupported")
-- absurd dimensions in a header: refused before anything is allocated
t.raises(function() decoder("RGB")(bytes_of("P6 100000 100000 255\n" .. raw(px, 3))) end,
  NODE .. ": PNM: 100000 x 100000 pixels is larger than the limit of 256 MiB", "PNM 10^5 x 10^5: the size limit")
t.raises(function() decoder("RGB")(bytes_of(bmp(3, 2, px):sub(1, 18) .. string.pack("<i4i4", 2000000000, 2000000000)
  .. bmp(3, 2, px):sub(27))) end, NODE .. ": BMP: .*larger than the limit", "BMP 2e9 x 2e9: the size limit")
needs("png", 2, function()
  t.raises(function() decoder("RGB")(bytes_of(png(3, 2, 2, scanlines(px, 3), 0x7fffffff, 0x7fffffff))) end,
    NODE .. ": PNG: .*limit", "PNG 2^31 x 2^31: refused at the header")
  t.raises(function() decoder("RGB")(bytes_of(png(3, 2, 2, scanlines(px, 3), 3, 50))) end,
    NODE .. ": PNG: ", "PNG whose rows are fewer than its header says")
end)
t.raises(function() decoder("RGB")(bytes_of(bmp(3, 2, px):sub(1, 60))) end, NODE .. ": BMP: pixel data truncated",
  "truncated BMP")
needs("jpg", 1, function() t.raises(function() decoder("RGB")(bytes_of(read("rgb.jpg"):sub(1, 400))) end,
  NODE .. ": JPEG: ", "truncated JPEG") end)
t.raises(function() decoder("RGB")(bytes_of(read("rgb.jpg"):sub(1, 400))) end, NODE, "truncated JPEG: an error in any build")
-- every truncation and many byte flips of every file: a clean error or an
-- image of the right shape, never a crash
local files = {}
for _, n in ipairs(names) do files[#files + 1] = {n, read(n)} end
for _, m in ipairs(made) do files[#files + 1] = {m[1], m[2]} end
for _, f in ipairs(files) do
  local name, s = f[1], f[2]
  local bad = nil
  local function try(b, what)
    local ok, y = pcall(decoder("RGB"), bytes_of(b))
    if ok then
      if y:dim() ~= 3 or y.shape[3] ~= 3 then bad = bad or (what .. ": shape " .. table.concat(y.shape, "x")) end
    elseif not tostring(y):find(NODE) then
      bad = bad or (what .. ": " .. tostring(y))
    end
  end
  for n = 0, #s - 1, math.max(1, #s // 60) do try(s:sub(1, n), "truncated at " .. n) end
  local seed = 12345
  for k = 1, 150 do
    seed = (seed * 1103515245 + 12345) % 2147483648
    local i = seed % #s + 1
    local v = (seed >> 8) % 256
    try(s:sub(1, i - 1) .. string.char(v) .. s:sub(i + 1), ("byte %d set to %d"):format(i, v))
    if k % 3 == 0 then try(s:sub(1, i - 1) .. s:sub(i + 1), ("byte %d removed"):format(i)) end
  end
  t.ok(bad == nil, name .. ": truncations and corrupt bytes give clean errors or images" .. (bad and (" (" .. bad .. ")") or ""))
end

-- ---- inputs of the wrong dtype or rank; a bad attribute ----------------------
t.raises(function() decoder("RGB", "float", {4})(fl.zeros({4})) end, NODE .. ": the encoded image must be uint8, got float32",
  "a float input: an error")
t.raises(function() decoder("RGB", "int64", {4})(fl.zeros({4}, {dtype = "int64"})) end,
  NODE .. ": the encoded image must be uint8, got int64", "an int64 input: an error")
t.raises(function() decoder("RGB", "uint8", {2, 2})(fl.zeros({2, 2}, {dtype = "int64"})) end,
  NODE .. ": the encoded image must be 1%-d, got 2%-d", "a 2-d input: an error")
t.raises(function() decoder("RGBA") end, "node 'dec' %(ImageDecoder, opset 20%): pixel_format must be RGB, BGR or Grayscale",
  "pixel_format RGBA: an error at load")

t.done()
