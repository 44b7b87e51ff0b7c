-- Backward attention: dQ, dK, dV from Q, K, V, O, dO and the forward's
-- log-sum-exp, recomputing P on chip. Three kernels in one module (one
-- source, one cubin), assembled here:
--   NAME_pre   D = rowsum(dO ∘ O) per query row (fp32); kernel_bwd_rows.lua
--   NAME       one thread block per (key block group, kv head, batch): K and V
--              stay in shared memory, dK and dV in registers; it walks every
--              (query head of its group, query tile) that sees its keys and
--              adds dQ to an fp32 accumulator in global memory; this file
--   NAME_post  dQ = scale · Σ slices of the accumulator, in the input dtype;
--              kernel_bwd_dq.lua
-- The k loops of the three phases stay rolled: unrolled, ptxas hoists the
-- operand loads of every step and spills dK/dV.
-- The fast schedule gives each key block its own thread block and adds dQ
-- with atomics; the deterministic one gives each thread block a fixed list of
-- key blocks and its own accumulator slice, summed in a fixed order.
local text = import("lib_text")
local device = import("lib_device")
local fragment = import("lib_fragment")
local mask = import("lib_mask")
local logits = import("lib_logits")
local dropout = import("lib_dropout")
local sparse = import("lib_sparse")
local sequence = import("lib_seq")
local tile_io = import("lib_tile_io")
local epilogue = import("lib_epilogue")
local width = import("lib_width")
local isa_for = import("isa")
local rows_kernel = import("kernel_bwd_rows")
local dq_kernel = import("kernel_bwd_dq")

-- fp32 pair added to the dQ accumulator: atomically (fast schedule), or as a
-- plain read-modify-write when this thread block owns the slice. sm_90 adds
-- the pair in one instruction, which needs PTX ISA 8.1: NVRTC 12.0 gets the
-- two adds of the older GPUs.
local function dq_add(arch)
  local two = 'asm volatile("red.global.add.f32 [%0], %1;\\n" ::"l"(q), "f"(x) : "memory");\n'
      .. '    asm volatile("red.global.add.f32 [%0], %1;\\n" ::"l"(q + 1), "f"(y) : "memory");'
  local red = arch >= 90
      and '// one instruction for the pair needs PTX ISA 8.1 (NVRTC 12.1 or newer)\n'
         .. '#if __CUDACC_VER_MAJOR__ > 12 || __CUDACC_VER_MINOR__ >= 1\n'
         .. '    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\\n" ::"l"(q), "f"(x), "f"(y) : "memory");\n'
         .. '#else\n    ' .. two .. '\n#endif'
      or two
  return text.fill([[
struct alignas(8) float_pair { float x, y; };

// Adds without waiting for the old value. In the deterministic schedule a
// thread block owns its slice and each element of it is only ever added to by
// one thread; that thread's adds to one address take effect in program order,
// so the sums come out the same every run.
__device__ __forceinline__ void dq_add(float* q, float x, float y) {
  ${red}
}

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 x) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(x));
}
]], { red = red })
end

local kernel = [[
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const fg_bwd_params p) {
  extern __shared__ u128 smem[];
  // shared memory: K, V [BLOCK_N][SMEM_ROW]; Q, dO [STAGES][BLOCK_M][SMEM_ROW];${v_rows}
  // P (dropped and scaled), dS [BLOCK_M][DS_ROW] (query rows x keys)
  constexpr u32 TILE_Q = BLOCK_M * SMEM_ROW * 2, TILE_K = BLOCK_N * SMEM_ROW * 2;${tile_v_decl}
  const u32 sK = smem_addr(smem);
  const u32 sV = sK + TILE_K;
  const u32 sQ0 = sV + ${tile_v};
  const u32 sDO0 = sQ0 + STAGES * TILE_Q;
  const u32 sP = sDO0 + STAGES * ${tile_do};
  const u32 sDS = sP + BLOCK_M * DS_ROW * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  ${lanes}  // MMA fragment row group and column pair
  // phase 1 (S, dP): S_MT*16 query rows x S_KN keys per warp
  const int s_row = (warp % S_WARPS_M) * S_MT * 16, s_key = (warp / S_WARPS_M) * S_KN;

  // block -> (column split, key block group, kv head, batch); groups before
  // heads, so the key blocks with the most queries under a causal mask start
  // first
  int bid = blockIdx.x;
  const int col0 = (bid % COL_SPLITS) * (HEAD_DIM_PADDED / COL_SPLITS);  // this block's columns${col0_v_decl}
  bid /= COL_SPLITS;
  const int group = bid % p.n_groups;
  bid /= p.n_groups;
  const int hk = bid % p.heads_kv, b = bid / p.heads_kv;
  Seq seq;  // b == p.batch: a packed call's key rows after its last sequence
  seq.init(p, b);

  // phase 2 (dK, dV): KV_KT*16 keys x KV_CN columns per warp
  const int kv_key = (warp % KV_WARPS_N) * KV_KT * 16, kv_col = col0 + (warp / KV_WARPS_N) * KV_CN;${kv_col_v_decl}
  // phase 3 (dQ): Q_MT*16 query rows x Q_CN columns per warp
  const int q_row = (warp % Q_WARPS_M) * Q_MT * 16, q_col = col0 + (warp / Q_WARPS_M) * Q_CN;
  // This lane's ldmatrix offsets (bytes) in each kind of operand:
  // A from a row-major [m][k] tile; B from an [n][k] tile; B from a [k][n]
  // tile, transposed on load; and A from a [k][m] P/dS tile, transposed.
  const u32 a_lane = ((lane & 15) * SMEM_ROW + (lane >> 4) * 8) * 2;
  const u32 b_lane = (((lane & 7) + (lane >> 4) * 8) * SMEM_ROW + ((lane >> 3) & 1) * 8) * 2;
  const u32 bt_lane = (((lane & 7) + ((lane >> 3) & 1) * 8) * SMEM_ROW + (lane >> 4) * 8) * 2;${v_lanes}
  const u32 a_lane_ds = ((lane & 15) * DS_ROW + (lane >> 4) * 8) * 2;
  const u32 at_lane_ds = (((lane & 7) + ((lane >> 4) & 1) * 8) * DS_ROW + ((lane >> 3) & 1) * 8) * 2;

  const int heads_per_kv = p.heads_q / p.heads_kv;
  const u16* gK = (const u16*)p.k + seq.k_at(p.k_sb, p.k_ss, 0) + hk * p.k_sh;
  const u16* gV = (const u16*)p.v + seq.k_at(p.v_sb, p.v_ss, 0) + hk * p.v_sh;
  float* const dq_acc = (float*)p.dq_accum + (group % p.dq_slices) * p.dq_slice;

  auto load_q_do = [&](const Steps& s, int stage) {
    const int r0 = s.m * BLOCK_M;
    load_tile<BLOCK_M>(sQ0 + stage * TILE_Q,
                       (const u16*)p.q + seq.q_at(p.q_sb, p.q_ss, r0) + s.h * p.q_sh, p.q_ss,
                       seq.seqlen_q - r0, tid);
    ${v_load}<BLOCK_M>(sDO0 + stage * ${tile_do},
                       (const u16*)p.d_o + seq.q_at(p.do_sb, p.do_ss, r0) + s.h * p.do_sh,
                       p.do_ss, seq.seqlen_q - r0, tid);
  };

  // key blocks in rounds of n_groups, every other round in reverse (steps
  // alternate between 2(n_groups - group) - 1 and 2 group + 1): under a
  // causal mask each group then gets long and short key blocks alike
  // (a packed sequence's own key blocks: those of its rows, zero past the
  // keys it sees)
  const int n_blocks = (seq.rows_k + BLOCK_N - 1) / BLOCK_N;
  int step = 2 * (p.n_groups - group) - 1;
  for (int nb = group; nb < n_blocks; nb += step, step = 2 * p.n_groups - step) {
    const int n0 = nb * BLOCK_N;
    // query rows that may see these keys, as a range of query tiles
${query_range}
    const int t_lo = i_lo / BLOCK_M;
    const int t_hi = i_hi > i_lo && n0 < seq.seqlen_k ? (i_hi + BLOCK_M - 1) / BLOCK_M : t_lo;
    Steps cur;
    cur.start(p, b, hk * heads_per_kv, heads_per_kv, n0, t_lo, t_hi);

    __syncthreads();  // the previous key block is done with every buffer
    load_tile<BLOCK_N>(sK, gK + (i64)n0 * p.k_ss, p.k_ss, seq.seqlen_k - n0, tid);
    ${v_load}<BLOCK_N>(sV, gV + (i64)n0 * p.v_ss, p.v_ss, seq.seqlen_k - n0, tid);
    if (cur.valid()) load_q_do(cur, 0);
    copy_commit();

${zero_dkdv}

    int stage = 0;
    while (cur.valid()) {
      const int h = cur.h, row0 = cur.m * BLOCK_M;
      Steps nxt = cur;
      nxt.advance(p);
      copy_wait_all();
      __syncthreads();  // Q and dO of this step landed; P and dS of the last step are consumed
      if (STAGES == 2) {
        if (nxt.valid()) load_q_do(nxt, stage ^ 1);
        copy_commit();
      }
      const u32 sQ = sQ0 + stage * TILE_Q, sDO = sDO0 + stage * ${tile_do};

      // this thread's rows of phase 1: log-sum-exp in base 2 (+inf for rows
      // past the end or with no visible key, so P = 0) and D
      float lse2[S_MT][2], row_d[S_MT][2];
#pragma unroll
      for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = row0 + s_row + mt * 16 + g + 8 * r;
          lse2[mt][r] = FG_POS_INF;
          row_d[mt][r] = 0.f;
          if (i < seq.seqlen_q) {
            const i64 ri = seq.stat(p, h, i);
            const float l = ((const float*)p.lse)[ri];
            if (l != FG_NEG_INF) lse2[mt][r] = l * 1.4426950408889634f;
            row_d[mt][r] = ((const float*)p.delta)[ri];
          }
        }

      // ---- phase 1: S = Q·Kᵀ and dP = dO·Vᵀ (this warp's rows x keys), fp32
      float acc_s[S_MT][S_NT][4], acc_dp[S_MT][S_NT][4];
${deriv_decl}#pragma unroll
      for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = acc_dp[mt][nt][e] = 0.f;
${phase1}
${logits}${apply_mask}
      // P = exp(S·scale − lse), in base 2
#pragma unroll
      for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_s[mt][nt][e] = fast_exp2(fmaf(acc_s[mt][nt][e], ${to_log2}, -lse2[mt][e >> 1]));
${apply_dropout}
      // dS = P ∘ (dP − D) and the P that multiplied V, to shared memory
#pragma unroll
      for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const u32 off = ((s_row + mt * 16 + g + 8 * r) * DS_ROW + s_key + nt * 8 + 2 * t) * 2;
            float pd[2], ds[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float pv = acc_s[mt][nt][2 * r + c], dp = acc_dp[mt][nt][2 * r + c];
${combine}${derivative}
            }
            st_shared_u32(sP + off, pack2(pd[0], pd[1]));
            st_shared_u32(sDS + off, pack2(ds[0], ds[1]));
          }
      __syncthreads();  // P and dS complete

      // ---- phase 2: dV += Pᵀ·dO and dK += dSᵀ·Q (this warp's keys x columns)
#pragma unroll 1
      for (int ks = 0; ks < BLOCK_M / 16; ++ks) {
        u32 ap[KV_KT][4], ads[KV_KT][4];
#pragma unroll
        for (int kt = 0; kt < KV_KT; ++kt) {
          ldmatrix_x4_trans(ap[kt], sP + at_lane_ds + (ks * 16 * DS_ROW + kv_key + kt * 16) * 2);
          ldmatrix_x4_trans(ads[kt], sDS + at_lane_ds + (ks * 16 * DS_ROW + kv_key + kt * 16) * 2);
        }
${phase2}
      }

      // ---- phase 3: dQ += dS·K (this warp's rows x columns, DQ_CHUNK at a
      // time), unscaled into the fp32 accumulator
#pragma unroll
      for (int c0 = 0; c0 < Q_CN; c0 += DQ_CHUNK) {
        float acc_dq[Q_MT][DQ_CHUNK / 8][4];
#pragma unroll
        for (int mt = 0; mt < Q_MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < DQ_CHUNK / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dq[mt][nt][e] = 0.f;
#pragma unroll 1
        for (int ks = 0; ks < BLOCK_N / 16; ++ks) {
          u32 a[Q_MT][4];
#pragma unroll
          for (int mt = 0; mt < Q_MT; ++mt)
            ldmatrix_x4(a[mt], sDS + a_lane_ds + ((q_row + mt * 16) * DS_ROW + ks * 16) * 2);
#pragma unroll
          for (int cp = 0; cp < DQ_CHUNK / 16; ++cp) {
            if (c0 + cp * 16 < Q_CN) {
              u32 bk[4];  // 16 keys x two 8-column tiles of K
              ldmatrix_x4_trans(bk, sK + bt_lane + (ks * 16 * SMEM_ROW + q_col + c0 + cp * 16) * 2);
#pragma unroll
              for (int mt = 0; mt < Q_MT; ++mt) {
                mma_16x8x16(acc_dq[mt][2 * cp], a[mt], bk[0], bk[1]);
                mma_16x8x16(acc_dq[mt][2 * cp + 1], a[mt], bk[2], bk[3]);
              }
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < Q_MT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = row0 + q_row + mt * 16 + g + 8 * r;
            if (i < seq.seqlen_q) {
              float* row = dq_acc + seq.stat(p, h, i) * HEAD_DIM_PADDED + q_col + c0 + 2 * t;
#pragma unroll
              for (int nt = 0; nt < DQ_CHUNK / 8; ++nt)
                if (c0 + nt * 8 < Q_CN)
                  dq_add(row + nt * 8, acc_dq[mt][nt][2 * r], acc_dq[mt][nt][2 * r + 1]);
            }
          }
      }

      if (STAGES == 1) {
        __syncthreads();  // every warp is done with Q and dO
        if (nxt.valid()) load_q_do(nxt, 0);
        copy_commit();
      } else {
        stage ^= 1;
      }
      cur = nxt;
    }

    // dK = scale · Σ dSᵀ·Q and dV = Σ Pᵀ·dO over every step; keys past the
    // end are not written (a packed sequence's rows past the keys it sees
    // get zeros)
#pragma unroll
    for (int kt = 0; kt < KV_KT; ++kt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = n0 + kv_key + kt * 16 + g + 8 * r;
        if (j < seq.rows_k) {
          u16* const dk_row = (u16*)p.dk + seq.k_at(p.dk_sb, p.dk_ss, j) + hk * p.dk_sh;
          u16* const dv_row = (u16*)p.dv + seq.k_at(p.dv_sb, p.dv_ss, j) + hk * p.dv_sh;
${store_dkdv}
        }
      }
  }
}
]]

-- Per element of phase 1: pv is P (negated where dropout dropped it), dp is
-- dO·Vᵀ (zeroed where dropped); pd is the P that multiplied V.
local combine_plain = [[
pd[c] = pv;
ds[c] = pv * (dp - row_d[mt][r]);]]
local combine_dropout = [[
pd[c] = fmaxf(pv, 0.f) * p.out_scale;
ds[c] = fabsf(pv) * fmaf(dp, p.out_scale, -row_d[mt][r]);]]

-- The pieces of the main kernel that V's width shapes (lib_width.lua). With
-- one width, K and V (Q and dO) share every loop over columns; with two,
-- phase 1 takes the steps both have in one loop and the wider one's rest in
-- another, and phase 2 and the stores loop over dK's and dV's columns apart.

-- dK and dV in registers, zeroed.
local function zero_dkdv(same)
  if same then
    return [[
    float acc_dk[KV_KT][KV_CT][4], acc_dv[KV_KT][KV_CT][4];  // keys (g, g+8) x columns (2t, 2t+1)
#pragma unroll
    for (int kt = 0; kt < KV_KT; ++kt)
#pragma unroll
      for (int ct = 0; ct < KV_CT; ++ct)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[kt][ct][e] = acc_dv[kt][ct][e] = 0.f;]]
  end
  return [[
    float acc_dk[KV_KT][KV_CT][4], acc_dv[KV_KT][KV_CT_V][4];  // keys (g, g+8) x columns (2t, 2t+1)
#pragma unroll
    for (int kt = 0; kt < KV_KT; ++kt) {
#pragma unroll
      for (int ct = 0; ct < KV_CT; ++ct)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[kt][ct][e] = 0.f;
#pragma unroll
      for (int ct = 0; ct < KV_CT_V; ++ct)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dv[kt][ct][e] = 0.f;
    }]]
end

-- Phase 1's steps `from` .. `to` (C) of 16 columns: S = Q·Kᵀ (s) and dP =
-- dO·Vᵀ (dp), V's and dO's rows of v_row elements, their lane offsets
-- v_lane.a and v_lane.b.
local function phase1_loop(from, to, s, dp, v_row, v_lane)
  local a, loads_a, b, loads_b, mmas = {}, {}, {}, {}, {}
  if s then
    a[#a + 1] = "aq[S_MT][4]"
    loads_a[#loads_a + 1] = "          ldmatrix_x4(aq[mt], sQ + a_lane + ((s_row + mt * 16) * SMEM_ROW + ks * 16) * 2);"
    b[#b + 1] = "bk[4]"
    loads_b[#loads_b + 1] = "          ldmatrix_x4(bk, sK + b_lane + ((s_key + np * 16) * SMEM_ROW + ks * 16) * 2);"
    mmas[#mmas + 1] = "            mma_16x8x16(acc_s[mt][2 * np], aq[mt], bk[0], bk[1]);\n"
                   .. "            mma_16x8x16(acc_s[mt][2 * np + 1], aq[mt], bk[2], bk[3]);"
  end
  if dp then
    a[#a + 1] = "ado[S_MT][4]"
    loads_a[#loads_a + 1] = "          ldmatrix_x4(ado[mt], sDO + " .. v_lane.a .. " + ((s_row + mt * 16) * " .. v_row .. " + ks * 16) * 2);"
    b[#b + 1] = "bv[4]"
    loads_b[#loads_b + 1] = "          ldmatrix_x4(bv, sV + " .. v_lane.b .. " + ((s_key + np * 16) * " .. v_row .. " + ks * 16) * 2);"
    mmas[#mmas + 1] = "            mma_16x8x16(acc_dp[mt][2 * np], ado[mt], bv[0], bv[1]);\n"
                   .. "            mma_16x8x16(acc_dp[mt][2 * np + 1], ado[mt], bv[2], bv[3]);"
  end
  return text.fill([[
#pragma unroll 1
      for (int ks = ${from}; ks < ${to}; ++ks) {
        u32 ${a};
#pragma unroll
        for (int mt = 0; mt < S_MT; ++mt) {
${loads_a}
        }
#pragma unroll
        for (int np = 0; np < S_NT / 2; ++np) {
          u32 ${b};  // two 8-key tiles x 16 dims of ${of}
${loads_b}
#pragma unroll
          for (int mt = 0; mt < S_MT; ++mt) {
${mmas}
          }
        }
      }]], { from = from, to = to, a = table.concat(a, ", "), b = table.concat(b, ", "),
              loads_a = table.concat(loads_a, "\n"), loads_b = table.concat(loads_b, "\n"),
              mmas = table.concat(mmas, "\n"),
              of = s and dp and "K and of V" or s and "K" or "V" })
end

-- Phase 2's column pairs 0 .. count (C): dV += Pᵀ·dO (dv, its columns from
-- kv_col_v, dO's rows of v_row, their lane offset v_lane.bt) and dK += dSᵀ·Q
-- (dk).
local function phase2_loop(count, dv, dk, kv_col_v, v_row, v_lane)
  local b, loads, mmas = {}, {}, {}
  if dv then
    b[#b + 1] = "bo[4]"
    loads[#loads + 1] = "          ldmatrix_x4_trans(bo, sDO + " .. v_lane.bt .. " + (ks * 16 * " .. v_row .. " + " .. kv_col_v .. " + cp * 16) * 2);"
    mmas[#mmas + 1] = "            mma_16x8x16(acc_dv[kt][2 * cp], ap[kt], bo[0], bo[1]);\n"
                   .. "            mma_16x8x16(acc_dv[kt][2 * cp + 1], ap[kt], bo[2], bo[3]);"
  end
  if dk then
    b[#b + 1] = "bq[4]"
    loads[#loads + 1] = "          ldmatrix_x4_trans(bq, sQ + bt_lane + (ks * 16 * SMEM_ROW + kv_col + cp * 16) * 2);"
    mmas[#mmas + 1] = "            mma_16x8x16(acc_dk[kt][2 * cp], ads[kt], bq[0], bq[1]);\n"
                   .. "            mma_16x8x16(acc_dk[kt][2 * cp + 1], ads[kt], bq[2], bq[3]);"
  end
  return text.fill([[
#pragma unroll
        for (int cp = 0; cp < ${count}; ++cp) {
          u32 ${b};  // 16 query rows x two 8-column tiles of ${of}
${loads}
#pragma unroll
          for (int kt = 0; kt < KV_KT; ++kt) {
${mmas}
          }
        }]], { count = count, b = table.concat(b, ", "), loads = table.concat(loads, "\n"),
                mmas = table.concat(mmas, "\n"), of = dv and dk and "dO and of Q" or dv and "dO" or "Q" })
end

-- The stores of a key row's dK (scaled) and dV, two columns at a time:
-- parts, each { count = column tiles (C), col = first column (C), store =
-- the lib_epilogue store, which = "dk" or "dv" }, in one loop where they
-- share it (count and col alike).
local function store_loop(parts)
  local bodies = {}
  for _, x in ipairs(parts) do
    local values = x.which == "dk" and [[
              const float x0 = acc_dk[kt][ct][2 * r] * p.softmax_scale;
              const float x1 = acc_dk[kt][ct][2 * r + 1] * p.softmax_scale;]] or [[
              const float x0 = acc_dv[kt][ct][2 * r], x1 = acc_dv[kt][ct][2 * r + 1];]]
    bodies[#bodies + 1] = "            {\n              u16* out = " .. x.which .. "_row;\n" .. values .. "\n"
        .. text.indent(x.store, 14) .. "\n            }"
  end
  return text.fill([[
#pragma unroll
          for (int ct = 0; ct < ${count}; ++ct) {
            const int col = ${col} + ct * 8 + 2 * t;
${bodies}
          }]], { count = parts[1].count, col = parts[1].col, bodies = table.concat(bodies, "\n") })
end

return function(p)
  local isa = isa_for(p.arch)
  local name = "fg_bwd_" .. p.target_tag .. "_" .. p.spec_name .. "_m" .. p.block_m .. "n" .. p.block_n
               .. "w" .. p.warps .. (p.col_splits > 1 and ("s" .. p.col_splits) or "")
  local d = {
    s_mt = p.block_m // (16 * p.s_warps_m), s_kn = p.block_n // p.s_warps_n,
    kv_kt = p.block_n // (16 * p.kv_warps_n),
    kv_cn = p.head_dim_padded // (p.kv_warps_d * p.col_splits),
    kv_cn_v = p.head_dim_v_padded // (p.kv_warps_d * p.col_splits),
    q_mt = p.block_m // (16 * p.q_warps_m),
    q_cn = p.head_dim_padded // (p.q_warps_d * p.col_splits),
  }
  if p.s_warps_m * p.s_warps_n ~= p.warps or p.kv_warps_n * p.kv_warps_d ~= p.warps
     or p.q_warps_m * p.q_warps_d ~= p.warps then
    error("warp grids do not multiply to " .. p.warps .. " warps")
  end
  if d.s_kn % 16 ~= 0 or d.kv_cn % 16 ~= 0 or d.kv_cn_v % 16 ~= 0 or d.q_cn % 16 ~= 0 or d.s_mt < 1 or d.kv_kt < 1
     or d.q_mt < 1 then
    error("warp tiles must be whole 16x16 tiles")
  end
  if d.s_kn ~= 16 and d.s_kn % 32 ~= 0 then error("phase-1 key span must be 16 or a multiple of 32") end
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: backward attention (with ${name}_pre, ${name}_post).
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}${value}, mask ${mask}, dropout ${dropout},
//       sparsity ${sparsity})
// plan: Br=${block_m} Bc=${block_n} warps=${warps} Q/dO buffers=${stages}
//       warp grids S/dP ${s_warps_m}x${s_warps_n}, dK/dV ${kv_warps_n}x${kv_warps_d}, dQ ${q_warps_m}x${q_warps_d},
//       column splits ${col_splits}
//       head dim padded to ${head_dim_padded}, shared memory ${smem_bytes} bytes; target ${target}
]], {
    name = name, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, value = width.banner(p), mask = p.mask,
    dropout = p.dropout and "on" or "off",
    sparsity = p.sparsity, block_m = p.block_m, block_n = p.block_n, warps = p.warps,
    stages = p.stages, s_warps_m = p.s_warps_m, s_warps_n = p.s_warps_n,
    kv_warps_n = p.kv_warps_n, kv_warps_d = p.kv_warps_d, q_warps_m = p.q_warps_m,
    q_warps_d = p.q_warps_d, col_splits = p.col_splits, head_dim_padded = p.head_dim_padded,
    smem_bytes = p.smem_bytes, target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define SMEM_ROW ${smem_row}
#define DS_ROW ${ds_row}
#define BLOCK_M ${block_m}
#define BLOCK_N ${block_n}
#define THREADS ${threads}
#define STAGES ${stages}
#define S_WARPS_M ${s_warps_m}
#define S_MT ${s_mt}
#define S_KN ${s_kn}
#define S_NT (S_KN / 8)
#define KV_WARPS_N ${kv_warps_n}
#define KV_KT ${kv_kt}
#define KV_CN ${kv_cn}
#define KV_CT (KV_CN / 8)
#define Q_WARPS_M ${q_warps_m}
#define Q_MT ${q_mt}
#define Q_CN ${q_cn}
#define DQ_CHUNK ${dq_chunk}
#define COL_SPLITS ${col_splits}
#define FG_POS_INF __int_as_float(0x7f800000)
${value_defines}]], {
    head_dim = p.head_dim, head_dim_padded = p.head_dim_padded, smem_row = p.smem_row,
    ds_row = p.ds_row, block_m = p.block_m, block_n = p.block_n, threads = p.threads,
    stages = p.stages, s_warps_m = p.s_warps_m, s_mt = d.s_mt, s_kn = d.s_kn,
    kv_warps_n = p.kv_warps_n, kv_kt = d.kv_kt, kv_cn = d.kv_cn, q_warps_m = p.q_warps_m,
    q_mt = d.q_mt, q_cn = d.q_cn, dq_chunk = math.min(d.q_cn, p.dq_chunk),
    col_splits = p.col_splits,
    value_defines = width.same(p) and "" or width.defines(p, p.head_dim_v_padded, p.smem_row_v)
      .. "#define KV_CN_V " .. d.kv_cn_v .. "\n#define KV_CT_V (KV_CN_V / 8)\n" })
  -- Q, K, dQ and dK rows are the head dim wide; V, dO and dV rows the value
  -- head dim (vw)
  local same, vw = width.same(p), width.v(p)
  local phase1, phase2, store_dkdv
  if same then
    local lanes = { a = "a_lane", b = "b_lane", bt = "bt_lane" }
    phase1 = phase1_loop("0", "HEAD_DIM_PADDED / 16", true, true, "SMEM_ROW", lanes)
    phase2 = phase2_loop("KV_CT / 2", true, true, "kv_col", "SMEM_ROW", lanes)
    store_dkdv = store_loop({ { count = "KV_CT", col = "kv_col", which = "dk", store = epilogue.output_store(p) },
                              { count = "KV_CT", col = "kv_col", which = "dv", store = epilogue.output_store(p) } })
  else
    local qk_steps, v_steps = "HEAD_DIM_PADDED / 16", "HEAD_DIM_V_PADDED / 16"
    local wider_qk = p.head_dim_padded > p.head_dim_v_padded
    local common = wider_qk and v_steps or qk_steps
    local lanes = { a = "a_lane_v", b = "b_lane_v", bt = "bt_lane_v" }
    phase1 = phase1_loop("0", common, true, true, vw.row, lanes) .. "\n"
        .. phase1_loop(common, wider_qk and qk_steps or v_steps, wider_qk, not wider_qk, vw.row, lanes)
    phase2 = phase2_loop("KV_CT_V / 2", true, false, "kv_col_v", vw.row, lanes) .. "\n"
        .. phase2_loop("KV_CT / 2", false, true, "kv_col", vw.row, lanes)
    store_dkdv = store_loop({ { count = "KV_CT", col = "kv_col", which = "dk", store = epilogue.output_store(p) } })
        .. "\n" .. store_loop({ { count = "KV_CT_V", col = "kv_col_v", which = "dv", store = epilogue.output_store(p, vw) } })
  end
  -- phase 1's S (then P) and dP: m16n8 accumulators of one layout
  local frag_s = fragment.mma_m16n8({ array = "acc_s", m_tiles = "S_MT", n_tiles = "S_NT" })
  local apply_mask = mask.apply(p.mask, frag_s, {
    params = "p", seq = "seq", row0 = "row0 + s_row", key0 = "n0 + s_key", block_row0 = "row0",
    block_key0 = "n0", full = "cur.full()", predicate = logits.mask_predicate(p, { params = "p", seq = "seq", batch = "b", head = "h" }) })
  -- the aux tensors' gradients at dS: element (mt, nt, 2r + c) is query
  -- row0 + s_row + 16mt + g + 8r, key n0 + s_key + 8nt + 2t + c
  local grad_q, grad_k = logits.positions("p", "row0 + s_row + mt * 16 + g + 8 * r", "n0 + s_key + nt * 8 + 2 * t + c")
  local aux_grad = logits.aux_grad(p, "p", "ds[c]", "acc_sv[mt][nt][2 * r + c]", {
    b = "b", h = "h", q = grad_q, k = grad_k, seqlen_q = "seq.seqlen_q", seqlen_k = "seq.seqlen_k" })
  -- a dropped element: dP zeroed, P negated (combine_dropout reads the sign)
  local function drop(i) return "acc_dp" .. i .. " = 0.f; acc_s" .. i .. " = -acc_s" .. i .. ";" end
  local apply_dropout = p.dropout and dropout.apply(frag_s, {
    params = "p", batch = "b", head = "h", row0 = "row0 + s_row", key0 = "n0 + s_key", keys = d.s_kn,
    drop = drop }) or ""
  local body = text.fill(kernel, {
    name = name, v_load = vw.load, zero_dkdv = zero_dkdv(same), phase1 = phase1,
    phase2 = phase2, store_dkdv = store_dkdv,
    v_rows = same and "" or " V and dO of SMEM_ROW_V",
    tile_v_decl = same and ""
      or "\n  constexpr u32 TILE_V = BLOCK_N * SMEM_ROW_V * 2, TILE_DO = BLOCK_M * SMEM_ROW_V * 2;",
    tile_v = same and "TILE_K" or "TILE_V", tile_do = same and "TILE_Q" or "TILE_DO",
    col0_v_decl = same and ""
      or "\n  const int col0_v = (bid % COL_SPLITS) * (HEAD_DIM_V_PADDED / COL_SPLITS);  // and of V's",
    kv_col_v_decl = same and "" or "\n  const int kv_col_v = col0_v + (warp / KV_WARPS_N) * KV_CN_V;",
    -- the lane offsets of V's and dO's rows, where they are not Q's and K's
    v_lanes = same and "" or "\n  // ... and in V and dO, whose rows are SMEM_ROW_V long\n"
      .. "  const u32 a_lane_v = ((lane & 15) * SMEM_ROW_V + (lane >> 4) * 8) * 2;\n"
      .. "  const u32 b_lane_v = (((lane & 7) + (lane >> 4) * 8) * SMEM_ROW_V + ((lane >> 3) & 1) * 8) * 2;\n"
      .. "  const u32 bt_lane_v = (((lane & 7) + ((lane >> 3) & 1) * 8) * SMEM_ROW_V + (lane >> 4) * 8) * 2;",
    lanes = fragment.lane_decl(frag_s),
    query_range = text.indent(mask.query_range(p.mask, "seq"), 4),
    apply_mask = text.indent(apply_mask, 6),
    apply_dropout = text.indent(apply_dropout, 6),
    combine = text.indent(p.dropout and combine_dropout or combine_plain, 14),
    logits = text.indent_code(logits.transform(p, frag_s, {
      params = "p", seq = "seq", row0 = "row0 + s_row", key0 = "n0 + s_key", batch = "b", head = "h",
      deriv = "acc_f", keep = p.aux_grad and "acc_sv" or nil }), 6),
    to_log2 = logits.to_log2(p, "p"),
    deriv_decl = (logits.has_derivative(p) and "      float acc_f[S_MT][S_NT][4];  // ∂t/∂s of the logits\n" or "")
      .. (p.aux_grad and "      float acc_sv[S_MT][S_NT][4];  // the scaled scores, for the aux gradients\n" or ""),
    derivative = (p.aux_grad and "\n" .. text.indent(aux_grad, 14) or "") .. (logits.has_derivative(p)
      and "\n              ds[c] *= acc_f[mt][nt][2 * r + c];  // dS with respect to s" or ""),
  })
  local rows = rows_kernel({ name = name, head_dim = p.head_dim, varlen = p.varlen, width = vw })
  local sinks = p.sinks and logits.sinks_kernel({ name = name, params = "fg_bwd_params", varlen = p.varlen })
  local dq = dq_kernel({ name = name, head_dim = p.head_dim, head_dim_padded = p.head_dim_padded,
                         varlen = p.varlen })
  local pieces = {
    banner, constants, device.source, isa.prelude(p.dtype), p.params_struct,
    device.to_float(p.dtype), logits.device(p), p.dropout and dropout.device or "", sequence.source(p),
    sparse.query_tiles(p), tile_io.loader(p, isa, "1"),
  }
  if not same then pieces[#pieces + 1] = tile_io.loader(p, isa, "1", vw) end
  for _, x in ipairs({ dq_add(p.arch), rows.source, dq.source, sinks and sinks.source or "", body }) do
    pieces[#pieces + 1] = x
  end
  local source = table.concat(pieces, "\n")
  -- D first, then the main kernel: (column split, key block group, kv head,
  -- sequence) as it decodes blockIdx.x; then dQ
  local main = { entry = name, threads = p.threads, smem = p.smem_bytes,
                 grid = { { scale = p.col_splits }, { "n_groups" }, { "heads_kv" }, { "sequences" } } }
  return { source = source, name = name,
           launches = { rows.launch, main, dq.launch, sinks and sinks.launch or nil } }
end
