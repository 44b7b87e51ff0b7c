-- Text helpers for the emitters: fill (${name} substitution) and indent.
-- Emits no device code.
local M = {}

-- Replace ${name} with vars[name]; a name with no value is an error, so a
-- typo in a template fails at generation instead of reaching the compiler.
function M.fill(template, vars)
  return (template:gsub("%${([%w_]+)}", function(key)
    local value = vars[key]
    if value == nil then error("template variable '" .. key .. "' has no value", 2) end
    return tostring(value)
  end))
end

-- Indent every non-empty line by n spaces.
function M.indent(block, n)
  local pad = string.rep(" ", n)
  return (block:gsub("([^\n]+)", pad .. "%1"))
end

-- Indent every non-empty line but preprocessor lines (#pragma unroll) by n
-- spaces: code nested in a kernel's text keeps its pragmas at column 0.
function M.indent_code(block, n)
  local pad = string.rep(" ", n)
  return (block:gsub("([^\n]+)", function(line)
    if line:sub(1, 1) == "#" then return line end
    return pad .. line
  end))
end

return M
