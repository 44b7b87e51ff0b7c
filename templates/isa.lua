-- The instruction emitter for a target: sm_75 has its own; sm_80 and every
-- later arch share one. An emitter (isa_sm*.lua) has name, async_copy,
-- supports_bf16, copy_unroll (the #pragma unroll argument of tile copies) and
-- prelude(dtype), the device code for mma_16x8x16, pack2, copy16,
-- copy16_read_once (for data read once, as a KV cache streamed through:
-- on sm_80 and later its L2 lines are the first replaced), copy_commit,
-- copy_wait_all and copy_wait<N> (at most N groups left in flight).
return function(arch)
  if arch == 75 then return import("isa_sm75") end
  if arch >= 80 then return import("isa_sm80") end
  error("no emitter for sm_" .. tostring(arch))
end
