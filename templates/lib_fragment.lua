-- Fragment layouts: which lane holds which element of a warp's register
-- tile. The kernel that owns the registers declares their layout once, and
-- masks, softmax and dropout (lib_mask, lib_softmax, lib_dropout) generate
-- their loops and index arithmetic from the declaration instead of assuming
-- one. Emits no device code: lane_decl, loop_head and loops give the C of a
-- description's per-lane names and loops.
--
-- An accumulator description (fp32, one element per row and column of the
-- warp's tile) has these fields; C means a C expression, as text:
--   array      the C array that holds the elements ("acc_s")
--   m, n, e    the loops over a thread's elements, outermost first, each
--              { var = loop variable, count = C trip count }: row tiles of
--              16 rows, column tiles of 8 columns, and the four elements a
--              thread holds of one 16x8 tile. m.row is the tile's first row
--              and n.col its first column (C, from var); e.half (0 or 1)
--              puts element e on the lane's row + 8 * half and e.odd (0 or
--              1) on the lane's column + odd
--   index(m, n, e)  the C subscript of an element into array, from C
--              expressions for the three loop variables ("[mt][nt][e]")
--   row, col   the element's row and column inside the warp's tile, as
--              { elem = C, lane = C } to be added: elem uses only the loop
--              variables (a constant once the loops unroll), lane only the
--              per-lane names, so each lane computes it once; and slots,
--              how the distinct rows (columns) a lane holds are met: two in
--              each iteration of loop `loop` (m or n), told apart by `bit`
--              (C from e), at elem(v, b) (C, from the loop's variable and a
--              bit)
--   diag       the distinct diagonals a lane holds (the row's elem minus
--              the column's): { count = C, at = C slot of the element from
--              the loop variables, elem = function(slot C) giving the
--              difference }
--   pair       the lane's column pair in an 8-column tile (col.lane is
--              2 * pair); dropout's Philox counter is keyed on it
--   lanes      the per-lane names, { { name, C from lane }, ... }, in the
--              order lane_decl declares them
--   row_lanes  xor distances between the lanes that hold the same rows: the
--              shuffles that reduce a row over the warp
--   r          the loop over a thread's rows within one row tile { var, count }
--   row_index  the C subscript of a per-row value (row_max[mt][r]), from the
--              m and r variables
--   row_elems  the C subscripts of row r's two elements (adjacent columns)
--              in column tile n
--
-- A packed 16-bit A operand description (the P of P·V, which dropout's
-- apply_packed masks):
--   array, m, pair, lanes   as above
--   regs       the registers a thread holds of one 16x16 tile, each
--              { index = C subscript, half = 0 or 1, tile = 0 or 1 }: two
--              16-bit values of row lane row + 8 * half, at columns
--              2 * pair (low half) and 2 * pair + 1 of 8-column tile `tile`
--
-- Other layouts declare the same fields: the Hopper wgmma accumulator
-- (wgmma_m64) and its packed A registers (wgmma_a) below.
local text = import("lib_text")
local M = {}

-- g: the lane's row in a 16x8 tile (and g + 8); t: its column pair.
local quad_lanes = { { "g", "lane >> 2" }, { "t", "lane & 3" } }

-- The mma.sync m16n8 accumulator (C and D of m16n8k16 and m16n8k8): element
-- e of a 16x8 tile sits at row g + 8 * (e / 2), column 2t + e % 2. v: array,
-- m_tiles and n_tiles (C trip counts), n_var (the column tile variable, "nt"
-- unless given: two arrays with different column tiles can then share a row
-- loop).
function M.mma_m16n8(v)
  local n_var = v.n_var or "nt"
  local f = {
    array = v.array,
    m = { var = "mt", count = v.m_tiles, row = "mt * 16" },
    n = { var = n_var, count = v.n_tiles, col = n_var .. " * 8" },
    e = { var = "e", count = "4", half = "(e >> 1)", odd = "(e & 1)" },
    index = function(m, n, e) return "[" .. m .. "][" .. n .. "][" .. e .. "]" end,
    pair = "t",
    lanes = quad_lanes,
    row_lanes = { 1, 2 },
    r = { var = "r", count = "2" },
    row_index = "[mt][r]",
  }
  f.row = { elem = f.m.row .. " + 8 * " .. f.e.half, lane = "g",
            slots = { loop = f.m, bit = f.e.half,
                      elem = function(m, b) return m .. " * 16 + 8 * " .. b end } }
  f.col = { elem = f.n.col .. " + " .. f.e.odd, lane = "2 * " .. f.pair,
            slots = { loop = f.n, bit = f.e.odd, elem = function(n, b) return n .. " * 8 + " .. b end } }
  -- row - column = 8 (2 mt + half - nt) - odd
  local nt1 = "(" .. v.n_tiles .. ") - 1"
  f.diag = { count = "(2 * (" .. v.m_tiles .. ") + " .. nt1 .. ") * 2",
             at = "(mt * 2 + " .. f.e.half .. " - " .. n_var .. " + " .. nt1 .. ") * 2 + " .. f.e.odd,
             elem = function(i) return "8 * ((" .. i .. " >> 1) - (" .. nt1 .. ")) - (" .. i .. " & 1)" end }
  f.row_elems = { f.index("mt", n_var, "2 * r"), f.index("mt", n_var, "2 * r + 1") }
  return f
end

-- The A operand of mma.sync m16n8k16 packed from an m16n8 accumulator (two
-- 8-column tiles make one 16-deep step): registers 0 and 1 hold rows g and
-- g + 8 of tile 0, registers 2 and 3 those of tile 1. v: array, m_tiles.
function M.mma_m16n8k16_a(v)
  local function reg(k, half, tile) return { index = "[mt][" .. k .. "]", half = half, tile = tile } end
  return {
    array = v.array,
    m = { var = "mt", count = v.m_tiles, row = "mt * 16" },
    regs = { reg(0, 0, 0), reg(1, 1, 0), reg(2, 0, 1), reg(3, 1, 1) },
    pair = "t",
    lanes = quad_lanes,
  }
end

-- A Hopper wgmma m64nNk16 accumulator, seen by one warp of the warpgroup:
-- its 16 rows as float[N/2], element 4n + e of 8-column group n at row
-- g + 8 * (e / 2), column 8n + 2t + e % 2 (the m16n8 layout with one row
-- tile, groups side by side). v: array, n_tiles (C: N/8), n_var (as in
-- mma_m16n8).
function M.wgmma_m64(v)
  local n_var = v.n_var or "nt"
  local f = M.mma_m16n8({ array = v.array, m_tiles = "1", n_tiles = v.n_tiles, n_var = n_var })
  f.m.row = "0"
  f.index = function(m, n, e) return "[(" .. n .. ") * 4 + " .. e .. "]" end
  f.row_index = "[r]"
  f.row = { elem = "8 * " .. f.e.half, lane = "g",
            slots = { loop = f.m, bit = f.e.half, elem = function(_, b) return "8 * " .. b end } }
  f.row_elems = { f.index("mt", n_var, "2 * r"), f.index("mt", n_var, "2 * r + 1") }
  return f
end

-- The same accumulator holding a transposed tile (the backward's Sᵀ: keys as
-- its rows, queries as its columns), described as masks and dropout see a
-- tile, rows being queries and columns keys: an element's query is the
-- accumulator's column 8n + 2t + e % 2, its key the accumulator's row
-- g + 8 * (e / 2). v: as wgmma_m64's. Masks apply; row statistics and
-- dropout's draws (keyed on the column pair) do not, and are left out.
function M.wgmma_m64_transposed(v)
  local f = M.wgmma_m64(v)
  f.row, f.col = f.col, f.row
  -- row - column = 8 (nt - half) + odd
  local n_var = f.n.var
  f.diag = { count = "((" .. v.n_tiles .. ") + 1) * 2",
             at = "(" .. n_var .. " - " .. f.e.half .. " + 1) * 2 + " .. f.e.odd,
             elem = function(i) return "8 * ((" .. i .. " >> 1) - 1) + (" .. i .. " & 1)" end }
  f.row_index, f.row_elems, f.row_lanes, f.r, f.pair = nil, nil, nil, nil, nil
  return f
end

-- The A registers of wgmma's k16 step from registers, packed from a
-- wgmma_m64 accumulator: registers 4k .. 4k + 3 of step k hold rows g, g + 8
-- of 8-column group 2k, then of group 2k + 1 (the m16n8k16 A order). v:
-- array, k_var (the C name of the step).
function M.wgmma_a(v)
  local function reg(i, half, tile)
    return { index = "[4 * " .. v.k_var .. " + " .. i .. "]", half = half, tile = tile }
  end
  return {
    array = v.array,
    m = { var = "mt", count = "1", row = "0" },
    regs = { reg(0, 0, 0), reg(1, 1, 0), reg(2, 0, 1), reg(3, 1, 1) },
    pair = "t",
    lanes = quad_lanes,
  }
end

-- The declaration of a description's per-lane names, one line of C
-- ("const int g = lane >> 2, t = lane & 3;"); expects `lane` in scope.
function M.lane_decl(f)
  local parts = {}
  for _, l in ipairs(f.lanes) do parts[#parts + 1] = l[1] .. " = " .. l[2] end
  return "const int " .. table.concat(parts, ", ") .. ";"
end

-- "for (int v = 0; v < count; ++v)" for a loop { var, count }.
function M.loop_head(l)
  return "for (int " .. l.var .. " = 0; " .. l.var .. " < " .. l.count .. "; ++" .. l.var .. ")"
end

-- Loops as loops' with heads[i] (C lines, or nil) at the top of loop i's
-- body: work of one iteration of an outer loop, done once for its inner
-- ones.
function M.loops_with_heads(loops, heads, body)
  for i = #loops, 1, -1 do
    body = M.loops({ loops[i] }, (heads[i] or "") .. body)
  end
  return body
end

-- Unrolled nested loops (outermost first) around body, C lines with no final
-- newline; braces only around a body of more than one line. Pragma lines
-- stay at column 0, as in the kernels' text.
function M.loops(loops, body)
  local lines = {}
  for i, l in ipairs(loops) do
    lines[#lines + 1] = "#pragma unroll"
    lines[#lines + 1] = string.rep("  ", i - 1) .. M.loop_head(l)
  end
  local braced = body:find("\n") ~= nil
  if braced then lines[#lines] = lines[#lines] .. " {" end
  lines[#lines + 1] = text.indent_code(body, 2 * #loops)
  if braced then lines[#lines + 1] = string.rep("  ", #loops - 1) .. "}" end
  return table.concat(lines, "\n")
end

return M
