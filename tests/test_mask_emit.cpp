// The mask blocks the generator makes (lib_mask.apply) in real kernels,
// forward and backward, compiled for the host and run on one lane's accumulator against
// the masks' definition (lib_mask.lua): query i sees key j where j <
// seqlen_k and d = j - (i + diag_offset) is at most 0 (causal), or at least
// -left (left >= 0) and at most right (right >= 0) under a window. Random
// windows (sides unbounded too), lengths, offsets, tiles and lanes; every
// element of the lane's tile must come out -inf exactly where hidden, so
// the tile test (whole tiles skipped) is checked with it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

using std::max;
using std::min;
#define FG_NEG_INF (-__builtin_inff())

struct MaskParams {
  int window_left, window_right;
};
struct MaskSeq {
  int seqlen_k, diag_offset;
};
// Where element e of tile (mt, nt) of a lane (g, t) sits: query row0 + wr + q,
// key n0 + wk + k (mask_emit_gen.c's layouts)
enum MaskLayout { FWD_WGMMA, MMA_ROWS, BWD_TRANSPOSED };
static void place(int layout, int mt, int nt, int e, int g, int t, int* q, int* k) {
  const int row = mt * 16 + g + 8 * (e >> 1), col = nt * 8 + 2 * t + (e & 1);
  if (layout == BWD_TRANSPOSED) *q = col, *k = row;  // Sᵀ: keys are the accumulator's rows
  else *q = row, *k = col;
}
struct MaskCase {
  const char* name;
  int kind;    // fg_mask: 0 none, 1 causal, 2 window
  int layout;  // MaskLayout
  int block_m, block_n, m_tiles, n_tiles;
  void (*apply)(const MaskParams&, const MaskSeq&, int n0, int row0, int wr, int wk, int g, int t, float*);
};
#include "mask_emit_cases.inc"

static int visible(int kind, const MaskParams& p, const MaskSeq& s, int i, int j) {
  const int d = j - (i + s.diag_offset);
  if (j >= s.seqlen_k) return 0;
  if (kind == 1) return d <= 0;
  if (kind == 2) return (p.window_left < 0 || d >= -p.window_left) && (p.window_right < 0 || d <= p.window_right);
  return 1;
}

// 0 .. 2^62, for the far trials' lengths and tiles
static long long big() { return (long long)rand() << 31 ^ rand(); }

int main() {
  srand(1);
  int failed = 0;
  long elements = 0, hidden = 0;
  for (const MaskCase& c : mask_cases) {
    const int count = c.m_tiles * c.n_tiles * 4;
    float* acc = new float[count];
    int bad = 0;
    for (int trial = 0; trial < 200000 && bad < 5; ++trial) {
      MaskParams p{rand() % 5 == 0 ? -1 : rand() % 700, rand() % 5 == 0 ? -1 : rand() % 300};
      MaskSeq s{1 + rand() % 3000, rand() % 5 == 0 ? 0 : rand() % 800 - 400};
      int n0 = c.block_n * (rand() % 20), row0 = c.block_m * (rand() % 20);
      // one trial in eight far out: lengths, diagonals and tiles up to the
      // reach check_forward_args allows (forward_call_reach), the window's
      // sides clamped to it as the kernels take them
      const bool far = trial % 8 == 7;
      long long seqlen_q = 0, reach = 0;
      if (far) {
        const long long limit = c.kind == 2 ? (1 << 30) - 1024 : (1ll << 31) - 4096;
        seqlen_q = 1 + big() % (limit - 256), s.seqlen_k = 1 + (int)(big() % (limit - 256));
        const long long lo = s.seqlen_k - (limit - 256), hi = limit - 256 - seqlen_q;
        s.diag_offset = (int)(lo + big() % (hi - lo + 1));
        row0 = c.block_m * (int)(big() % ((seqlen_q + c.block_m - 1) / c.block_m));
        n0 = c.block_n * (int)(big() % ((s.seqlen_k + c.block_n - 1) / c.block_n));
      }
      // half the trials put the diagonal, or a window's edge, within a few
      // keys of the tile's corners, where the tile test decides
      const int near = rand() % 5 - 2;
      if (rand() % 2) {
        switch (rand() % 3) {
          case 0:  // the last key one past the first row's diagonal, or near it
            s.diag_offset = n0 + c.block_n - 2 - row0 + near;
            break;
          case 1:  // the right edge at the tile's last key, from the first row
            p.window_right = std::max(0, n0 + c.block_n - 1 - row0 - s.diag_offset + near);
            break;
          default:  // the left edge at the tile's first key, from the last row
            p.window_left = std::max(0, row0 + c.block_m - 1 + s.diag_offset - n0 + near);
        }
      }
      if (far) {
        // the edges moved above may reach past the limit: then another trial
        reach = max(seqlen_q + max(s.diag_offset, 0), s.seqlen_k + (long long)max(-s.diag_offset, 0)) + 256;
        if (reach > (c.kind == 2 ? (1 << 30) - 1024 : (1ll << 31) - 4096)) continue;
        const int wide[4] = {-1, (int)reach, (int)(reach - rand() % 300), rand() % 700};
        if (rand() % 2) p.window_left = (int)min<long long>(reach, wide[rand() % 4]);
        if (rand() % 2) p.window_right = (int)min<long long>(reach, wide[rand() % 4]);
      }
      // the warp's first row and key within the block: multiples of its
      // tile's rows and keys (the transposed tile: 16 keys, every query)
      const int rows = c.layout == BWD_TRANSPOSED ? c.block_m : c.layout == MMA_ROWS ? 16 * c.m_tiles : 16;
      const int keys = c.layout == BWD_TRANSPOSED ? 16 : 8 * c.n_tiles;
      const int wr = rows * (rand() % (c.block_m / rows)), wk = keys * (rand() % (c.block_n / keys));
      const int g = rand() % 8, t = rand() % 4;
      for (int k = 0; k < count; ++k) acc[k] = 1.f;
      c.apply(p, s, n0, row0, wr, wk, g, t, acc);
      for (int mt = 0; mt < c.m_tiles; ++mt)
        for (int nt = 0; nt < c.n_tiles; ++nt)
          for (int e = 0; e < 4; ++e) {
            const int k = (mt * c.n_tiles + nt) * 4 + e;
            int q, key;
            place(c.layout, mt, nt, e, g, t, &q, &key);
            const int i = row0 + wr + q, j = n0 + wk + key;
            const int want = visible(c.kind, p, s, i, j), got = acc[k] == 1.f;
            ++elements;
            hidden += !want;
            if (got != want && bad++ < 5)
              std::printf("FAIL %s: window (%d, %d), seqlen_k %d, diag %d, query %d key %d: %s, expected %s\n",
                          c.name, p.window_left, p.window_right, s.seqlen_k, s.diag_offset, i, j,
                          got ? "seen" : "hidden", want ? "seen" : "hidden");
          }
    }
    failed += bad > 0;
    delete[] acc;
  }
  std::printf("test_mask_emit: %d cases, %ld elements (%ld hidden), %d failed\n",
              (int)(sizeof mask_cases / sizeof mask_cases[0]), elements, hidden, failed);
  return failed ? 1 : 0;
}
