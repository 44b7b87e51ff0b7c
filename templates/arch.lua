-- The per-arch emitter for a target: sm_75 has its own; sm_80 and every
-- later arch share one.
return function(arch)
  if arch == 75 then return import("arch_sm75") end
  if arch >= 80 then return import("arch_sm80") end
  error("no emitter for sm_" .. tostring(arch))
end
