-- Row widths. Q and K rows (and dQ, dK) are the head dim wide; V, O, dO and
-- dV rows the value head dim wide (p.head_dim_v, which the host sets to the
-- head dim where a spec's do not differ). qk(p) and v(p) describe the two:
--   dim      elements in a row (a number)
--   name     the C macro of dim
--   padded   the C macro of dim rounded up to the kernel's step (16, or what
--            the plan padded it to)
--   row      the C macro of a shared-memory row's elements (padded rows)
--   load     the name of the loader of such tiles (lib_tile_io.loader)
-- Where the value width is the head dim, v(p) is qk(p): the kernel is one
-- width throughout and its text is that of a kernel with a single head dim.
-- Emits no device code but the macros of defines().
local text = import("lib_text")
local M = {}

function M.same(p)
  return p.head_dim_v == nil or p.head_dim_v == p.head_dim
end

function M.qk(p)
  return { dim = p.head_dim, name = "HEAD_DIM", padded = "HEAD_DIM_PADDED", row = "SMEM_ROW",
           load = "load_tile" }
end

function M.v(p)
  if M.same(p) then return M.qk(p) end
  return { dim = p.head_dim_v, name = "HEAD_DIM_V", padded = "HEAD_DIM_V_PADDED",
           row = "SMEM_ROW_V", load = "load_tile_v" }
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
