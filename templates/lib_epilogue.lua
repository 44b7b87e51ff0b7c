-- Output stores: emits the C that writes two adjacent fp32 results of one
-- row to a 16-bit output row. Expects in scope: out (u16*, the row), col (the
-- first of the two columns), x0 and x1 (the values), HEAD_DIM (or the
-- width's macro, lib_width.lua) and pack2 (the target's prelude).
local M = {}

-- Store two adjacent output columns of one row; width (lib_width.lua;
-- default the head dim's): the row's width.
function M.output_store(p, width)
  local dim, name = p.head_dim, "HEAD_DIM"
  if width then dim, name = width.dim, width.name end
  if dim % 8 == 0 then
    return "if (col < " .. name .. ") *(u32*)(out + col) = pack2(x0, x1);"
  end
  return (([[
if (col < NAME) {
  const u32 both = pack2(x0, x1);
  out[col] = (u16)(both & 0xffffu);
  if (col + 1 < NAME) out[col + 1] = (u16)(both >> 16);
}]]):gsub("NAME", name))
end

return M
