-- Output stores: emits the C that writes two adjacent fp32 results of one
-- row to a 16-bit output row. Expects in scope: out (u16*, the row), col (the
-- first of the two columns), x0 and x1 (the values), HEAD_DIM and pack2 (the
-- target's prelude).
local M = {}

-- Store two adjacent output columns of one row.
function M.output_store(p)
  if p.head_dim % 8 == 0 then
    return "if (col < HEAD_DIM) *(u32*)(out + col) = pack2(x0, x1);"
  end
  return [[
if (col < HEAD_DIM) {
  const u32 both = pack2(x0, x1);
  out[col] = (u16)(both & 0xffffu);
  if (col + 1 < HEAD_DIM) out[col + 1] = (u16)(both >> 16);
}]]
end

return M
