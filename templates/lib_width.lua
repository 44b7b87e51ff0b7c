-- Row widths. Q and K rows (and dQ, dK) are the head dim wide; V, O, dO and
-- dV rows the value head dim wide (p.head_dim_v, which the host sets to the
-- head dim where a spec's do not differ). qk(p) and v(p) describe the two:
--   dim      elements in a row (a number)
--   name     the C macro of dim
--   padded   the C macro of dim rounded up to the kernel's step (16, or what
--            the plan padded it to)
--   row      the C macro of a shared-memory row's elements (padded rows)
--   load     the name of the loader of such tiles (lib_tile_io.loader)
--   swizzled whether the plan left the shared rows unpadded (a row of the
--            padded width, a multiple of 64): then chunk k of row r sits at
--            chunk k ^ (r & 7) of the row (at(), lane(), lane_at())
-- Where the value width is the head dim, v(p) is qk(p): the kernel is one
-- width throughout and its text is that of a kernel with a single head dim.
-- Emits no device code: the macros of defines() and C expressions.
local text = import("lib_text")
local M = {}

function M.same(p)
  return p.head_dim_v == nil or p.head_dim_v == p.head_dim
end

function M.qk(p)
  return { dim = p.head_dim, name = "HEAD_DIM", padded = "HEAD_DIM_PADDED", row = "SMEM_ROW",
           load = "load_tile", swizzled = p.smem_row ~= nil and p.smem_row == p.head_dim_padded }
end

function M.v(p)
  if M.same(p) then return M.qk(p) end
  return { dim = p.head_dim_v, name = "HEAD_DIM_V", padded = "HEAD_DIM_V_PADDED",
           row = "SMEM_ROW_V", load = "load_tile_v",
           swizzled = p.smem_row_v ~= nil and p.smem_row_v == p.head_dim_v_padded }
end

-- C: the byte offset in a tile of such rows of row r's 16-byte chunk k (r
-- and k C expressions).
function M.at(w, r, k)
  if w.swizzled then
    return text.fill("${r} * ${row} * 2 + ((${k} ^ (${r} & 7)) << 4)", { r = r, k = k, row = w.row })
  end
  return text.fill("(${r} * ${row} + ${k} * 8) * 2", { r = r, k = k, row = w.row })
end

-- An ldmatrix lane's address in a tile of such rows: lane(w, name, r, k)
-- declares `name` for the lane's row r and chunk k (C expressions, k < 2);
-- lane_at(w, name, rows, chunks) is its address `rows` rows (a multiple of
-- 8; nil: none) and `chunks` chunks (even) further on, in bytes from the
-- tile. Swizzled rows are whole 128-byte lines, so moving chunks within
-- 128 bytes is a xor of the lane's address, and past them an add.
function M.lane(w, name, r, k)
  if w.swizzled then
    return text.fill("const u32 ${name} = (${r}) * ${row} * 2 + (((${k}) ^ ((${r}) & 7)) << 4);",
                     { name = name, r = r, k = k, row = w.row })
  end
  return text.fill("const u32 ${name} = ((${r}) * ${row} + (${k}) * 8) * 2;",
                   { name = name, r = r, k = k, row = w.row })
end

function M.lane_at(w, name, rows, chunks)
  local x = { name = name, rows = rows, chunks = chunks, row = w.row }
  if w.swizzled then  -- the xor within the lane's 128 bytes, past them an add
    return text.fill("(${name} ^ (((${chunks}) & 7) << 4)) + (((${chunks}) & ~7) << 4)"
                     .. (rows and " + (${rows}) * ${row} * 2" or ""), x)
  end
  return text.fill(rows and "${name} + ((${rows}) * ${row} + (${chunks}) * 8) * 2"
                   or "${name} + (${chunks}) * 16", x)
end

-- The value width's macros (none where it is the head dim): padded and row
-- are the plan's figures (head_dim_v_padded, smem_row_v).
function M.defines(p, padded, row)
  if M.same(p) then return "" end
  return text.fill([[
#define HEAD_DIM_V ${dim}
#define HEAD_DIM_V_PADDED ${padded}
#define SMEM_ROW_V ${row}
]], { dim = p.head_dim_v, padded = padded, row = row })
end

-- ", value head dim N" for banners where the widths differ.
function M.banner(p)
  if M.same(p) then return "" end
  return ", value head dim " .. p.head_dim_v
end

return M
