// The device code the generator makes for score and mask expressions, run
// on the host against the fp64 evaluator (reference/expr_eval.h): for each
// case of tests/expr_emit_cases.h at random points (scores, indices that
// reach outside the tensors, random tensors): t, ∂t/∂s, the tensors'
// gradients that fg_score_mod_grad adds, and the mask. The code under test
// is the kernels' own block (lib_logits' tensor reads and the emitted
// functions), compiled here with the few CUDA names it uses defined for
// the host. Floats are compared with a tolerance for float32 evaluation
// against fp64; ints and bools exactly.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "gen/expr.h"
#include "gen/spec.h"
#include "reference/expr_eval.h"
}
#include "tests/expr_emit_cases.h"

typedef int64_t i64;
typedef uint64_t u64;
#define __device__
#define __forceinline__ inline
template <class T> static T __ldg(const T* p) { return *p; }
static float __int_as_float(int x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
static float atomicAdd(float* at, float v) {
  float old = *at;
  *at += v;
  return old;
}

// the launch arguments' fields the block reads
struct Params {
  u64 aux_data[8];
  i64 aux_stride[24];
  int aux_size[24];
  u64 d_aux[8];
};

#include "expr_emit_cases.inc"

static int failures, checks;
#define CHECK(cond, ...)                     \
  do {                                       \
    ++checks;                                \
    if (!(cond)) {                           \
      if (++failures <= 30) {                \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);        \
        fputc('\n', stderr);                 \
      }                                      \
    }                                        \
  } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double unit() {  // [0, 1)
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static int pick(int lo, int hi) { return lo + (int)(unit() * (hi - lo + 1)); }

// float32 against fp64: equal infinities, or within a relative 2e-5 (1e-4 for
// the transcendental cases) of the larger of |value| and 1
static bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol * std::fmax(1.0, std::fabs(want));
}

int main() {
  // the tensors: float ones random, doc ids 0..4
  static float bias[4 * 60], gain[4], tab[3 * 4 * 4];
  static int32_t doc[50];
  static float d_bias[4 * 60], d_gain[4], d_tab[3 * 4 * 4];
  for (float& x : bias) x = (float)(unit() * 2 - 1);
  for (float& x : gain) x = (float)(0.5 + unit());
  for (float& x : tab) x = (float)(unit() * 2 - 1);
  for (int i = 0; i < 50; i++) doc[i] = i / 11;
  const void* data[EMIT_AUX_COUNT] = {bias, doc, gain, tab};
  float* grads[EMIT_AUX_COUNT] = {d_bias, nullptr, d_gain, d_tab};
  const size_t grad_n[EMIT_AUX_COUNT] = {4 * 60, 0, 4, 3 * 4 * 4};

  Params p;
  memset(&p, 0, sizeof p);
  ref_aux ref[EMIT_AUX_COUNT];
  for (int t = 0; t < EMIT_AUX_COUNT; t++) {
    p.aux_data[t] = (u64)(uintptr_t)data[t];
    p.d_aux[t] = (u64)(uintptr_t)grads[t];
    i64 stride = 1;
    for (int d = emit_aux[t].rank - 1; d >= 0; d--) {
      p.aux_size[3 * t + d] = emit_aux_size[t][d];
      p.aux_stride[3 * t + d] = stride;
      ref[t].data = data[t];
      ref[t].size[d] = emit_aux_size[t][d];
      ref[t].stride[d] = stride;
      stride *= emit_aux_size[t][d];
    }
  }

  for (int i = 0; i < EMIT_CASE_COUNT; i++) {
    fg_spec spec = emit_case_spec(i);
    static expr_tree trees[2];
    expr_aux decl[EXPR_MAX_AUX];
    char err[512];
    if (spec_expr_trees(&spec, &trees[0], &trees[1], err, sizeof err) != 0 ||
        spec_expr_aux(&spec, decl, err, sizeof err) != 0) {
      CHECK(false, "case %d: %s", i, err);
      continue;
    }
    const double tol = emit_cases[i].score && (strstr(emit_cases[i].score, "exp") ||
                                               strstr(emit_cases[i].score, "tanh"))
                           ? 1e-4 : 2e-5;
    int reads[EXPR_MAX_NODES];
    const int nreads = spec.score_mod ? expr_eval_float_reads(&trees[0], reads) : 0;
    for (int n = 0; n < 400; n++) {
      expr_env env;
      memset(&env, 0, sizeof env);
      // s mostly a few units, sometimes large; the points reach past every
      // tensor's edges
      env.s = (double)(float)(n % 10 == 0 ? (unit() * 200 - 100) : (unit() * 8 - 4));
      env.b = pick(0, 3), env.h = pick(0, 3), env.q = pick(0, 60), env.k = pick(0, 60);
      env.seqlen_q = pick(1, 61), env.seqlen_k = pick(1, 61);
      env.decl = decl, env.aux = ref, env.aux_count = EMIT_AUX_COUNT;
      const float s = (float)env.s;
      if (spec.score_mod) {
        double tan = 0.0;
        const double want = expr_eval_dual(&trees[0], &env, EXPR_WRT_S, &tan, nullptr);
        const float got = ec_score(i, p, s, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
        CHECK(close(got, want, tol), "case %d '%s' at s=%g b=%d h=%d q=%d k=%d: t %.9g, fp64 %.9g",
              i, spec.score_mod, env.s, env.b, env.h, env.q, env.k, (double)got, want);
        const float split = ec_score_split(i, p, s, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
        CHECK(close(split, want, tol), "case %d '%s' split at s=%g b=%d h=%d q=%d k=%d: t %.9g, fp64 %.9g",
              i, spec.score_mod, env.s, env.b, env.h, env.q, env.k, (double)split, want);
        if (!std::isinf(want)) {
          const float ds = ec_score_ds(i, p, s, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
          CHECK(close(ds, tan, tol), "case %d '%s' at s=%g q=%d k=%d: dt/ds %.9g, dual %.9g", i,
                spec.score_mod, env.s, env.q, env.k, (double)ds, tan);
        }
        // the gradient one dt = 0.75 adds, against the duals of every read
        if (nreads > 0 && !std::isinf(want)) {
          static double expect[EMIT_AUX_COUNT][4 * 60];
          memset(expect, 0, sizeof expect);
          for (int t = 0; t < EMIT_AUX_COUNT; t++)
            if (grads[t]) memset(grads[t], 0, grad_n[t] * sizeof(float));
          for (int r = 0; r < nreads; r++) {
            double d = 0.0;
            int64_t at = -1;
            expr_eval_dual(&trees[0], &env, reads[r], &d, &at);
            if (at >= 0) expect[trees[0].nodes[reads[r]].aux][at] += 0.75 * d;
          }
          ec_grad(i, 0.75f, p, s, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
          for (int t = 0; t < EMIT_AUX_COUNT; t++)
            for (size_t e = 0; grads[t] && e < grad_n[t]; e++)
              CHECK(close(grads[t][e], expect[t][e], tol),
                    "case %d '%s' at s=%g b=%d h=%d q=%d k=%d: d%s[%zu] %.9g, dual %.9g", i,
                    spec.score_mod, env.s, env.b, env.h, env.q, env.k, emit_aux[t].name, e,
                    (double)grads[t][e], expect[t][e]);
        }
      }
      if (spec.mask_mod) {
        const bool want = expr_eval(&trees[1], &env) != 0.0;
        const bool got = ec_mask(i, p, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
        CHECK(got == want, "case %d '%s' at b=%d h=%d q=%d k=%d sq=%d sk=%d: %d, fp64 %d", i,
              spec.mask_mod, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k, got, want);
        const bool split = ec_mask_split(i, p, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k);
        CHECK(split == want, "case %d '%s' split at b=%d h=%d q=%d k=%d sq=%d sk=%d: %d, fp64 %d", i,
              spec.mask_mod, env.b, env.h, env.q, env.k, env.seqlen_q, env.seqlen_k, split, want);
      }
    }
  }
  printf("test_expr_emit: %d cases, %d checks, %d failed\n", EMIT_CASE_COUNT, checks, failures);
  return failures ? 1 : 0;
}
