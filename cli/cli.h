/* The command line's shared pieces: options -> spec and problem. */
#ifndef FG_CLI_H
#define FG_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "harness/compare.h"
#include "harness/device.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "runtime/tools.h"

/* ---- conventions (cli/args.c) ---- */

/* Exit codes: 2 when the command line is wrong (an unknown option, a bad or
 * missing value, options that do not go together), 1 when the work failed. */
enum { CLI_EXIT_FAILED = 1, CLI_EXIT_USAGE = 2 };

/* "flashgen: " and the message, on stderr: every message of the command
 * line starts so. */
__attribute__((format(printf, 1, 2))) void cli_error(const char *fmt, ...);

/* Arguments read one at a time; `--opt=value` is split into the option and
 * its value, so it works wherever `--opt value` does. */
typedef struct cli_args {
    int argc;
    char **argv;
    int next;
} cli_args;

typedef struct cli_arg {
    const char *text;   /* the argument itself */
    char name[64];      /* "--seqlen" of "--seqlen=5", "-d", or a bare word */
    const char *value;  /* after '=', or the next argument once cli_args_value took it */
    int inline_value;   /* given as --opt=value */
    char typed[128];    /* as typed, for messages: "-d 300", "--head-dim=300" */
} cli_arg;

/* The next argument into a; 0 when none is left. */
int cli_args_next(cli_args *s, cli_arg *a);
/* a's value: the one after '=', or the next argument (taken). NULL after a
 * message when there is none. */
const char *cli_args_value(cli_args *s, cli_arg *a);
/* 0 for a flag given bare, -1 after a message when it had "=value". */
int cli_arg_flag(const cli_arg *a);
/* 0 when a's value has no white space, else -1 after a message: " 64" is
 * refused, not read as 64. */
int cli_arg_unspaced(const cli_arg *a);

/* The options a command has seen, for those that parse their own: an option
 * given twice is refused (which one would count is a guess). */
typedef struct cli_seen {
    char name[32][64];   /* the option's own name: "--jobs" for -j too */
    char typed[32][128]; /* as typed the first time */
    int count;
} cli_seen;
/* 0 the first time name is seen, else -1 after a message naming both. a is
 * the argument as typed (its value taken). */
int cli_once(cli_seen *seen, const char *name, const cli_arg *a);
/* The index of a's value in names, or -1 after a message that lists them. */
int cli_enum(const cli_arg *a, const char *const *names, int count);
/* "a, b, c" into buf. */
const char *cli_list(const char *const *names, int count, char *buf, size_t len);
/* The named targets, "t4, a100, ...", into buf. */
const char *cli_target_list(char *buf, size_t len);

/* Progress of long work on stderr (cli/args.c): "flashgen: WHAT DONE/TOTAL
 * (P%), ELAPSED elapsed, about LEFT left: LABEL", redrawn in place when
 * stderr is a terminal and stdout is not a pipe, else nothing.
 * FLASHGEN_PROGRESS=1 shows it anyway (a line per update off a terminal),
 * FLASHGEN_PROGRESS=0 never. Call cli_progress_hide before printing to
 * stdout (cli_error hides it itself). */
typedef struct cli_progress {
    int mode; /* 0 off, 1 redrawn in place, 2 a line per update */
    int done, total;
    double start;
    char what[32];
} cli_progress;
/* 0 off, 1 in place, 2 lines: what the environment and stderr ask for. */
int cli_progress_mode(void);
void cli_progress_start(cli_progress *p, const char *what, int total);
/* more items done, label the one now under way (NULL: none); redrawn. */
void cli_progress_step(cli_progress *p, int more, const char *label);
/* Erases p's line (NULL: whichever is shown), so stdout can be written. */
void cli_progress_hide(cli_progress *p);
void cli_progress_end(cli_progress *p);
/* The line itself, and a duration as it shows them ("4.2s", "37s", "3m05s",
 * "1h02m"). */
void cli_progress_line(const char *what, int done, int total, double elapsed, const char *label,
                       char *buf, size_t len);
void cli_progress_duration(double s, char *buf, size_t len);

/* ---- the spec and problem options (cli/options.c) ---- */

#define CLI_MAX_SEQS 64 /* lengths listed on the command line */

typedef struct cli_problem {
    fgh_shape shape;       /* launch arguments; shape.seed also seeds the inputs */
    int bhsd;              /* 0: (B,S,H,D), 1: (B,H,S,D) */
    double layout_density; /* FG_SPARSE_LAYOUT: fraction of kept blocks */
    /* spec.varlen: each sequence's queries and keys (--lengths; none: drawn) */
    int len_q[CLI_MAX_SEQS], len_k[CLI_MAX_SEQS], length_count;
    /* spec.kv_cache: keys each sequence holds before the step (--cache-len;
       none: drawn), rows it appends, rows per page (0: a contiguous cache),
       thread blocks per sequence (0: chosen) */
    int cached[CLI_MAX_SEQS], cached_count;
    int seqlen_new, page_size, splits;
} cli_problem;

#define CLI_MAX_OPTIONS 48

typedef struct cli_options {
    fg_spec spec;
    fg_pass pass;           /* --backward */
    int deterministic;      /* --deterministic */
    cli_problem problem;
    const char *targets[8];
    int target_count;
    int all_targets;
    int csv;
    int quick;
    int head_dim_given, seqlen_given; /* bench: only this head dim / length (and
                                         spec.head_dim_v, when not 0, every shape's
                                         value head dim) */
    int page_size_given;              /* bench --kv-cache: only this page size */
    int repeats;
    int seqlens[16], seqlen_count; /* tune: --seqlens */
    int show, standard;            /* tune: --show, --standard */
    int tuned;                     /* bench: tune each shape, report tuned and derived */
    int philox;                    /* bench: Philox against the tensor-core work */
    int variants;                  /* bench: the logits' variants beside the plain kernel */
    int given;                     /* how many options were given */
    char typed[CLI_MAX_OPTIONS][128]; /* each option as typed, "" if not given (cli/options.c) */
} cli_options;

/* Parse and check the options after the command: an option the command does
 * not take, or one that does not go with the others, is refused. Returns 0,
 * 1 after --help was printed, or -1 after an error was printed. */
int cli_parse(int argc, char **argv, const char *command, cli_options *o);

/* A library message about o's spec, printed after "flashgen: " and where
 * (a target name; NULL for none); a leading spec field ("spec.head_dim: ")
 * is replaced by the option that set it, as typed ("-d 300: "). */
void cli_spec_error(const cli_options *o, const char *where, const char *message);

/* --aux NAME:TYPE:SIZES (cli/aux.c): one more tensor declared in spec, its
 * sizes in shape. 0, or -1 after a message. */
int cli_aux_parse(const char *text, fg_spec *spec, fgh_shape *shape);
/* The aux tensors' contents for a run (after fgh_problem_init): floats
 * uniform in [-1, 1), ints of one index 8 ascending runs (documents of equal
 * length), other ints in 0..7. */
void cli_aux_fill(fgh_rng *rng, fgh_problem *p);

/* fg_context_create; with FLASHGEN_COMPILE_LOG=1, each NVRTC compile is
 * logged on stderr. */
fg_status cli_context_create(fg_context **ctx, const char *target);

/* A compile's time as the tables show it: "812ms", or "cached" when the
 * kernel came from the kernel cache, memory or a bundle (no compile). */
const char *cli_compile_time(const fg_kernel_info *info, char *buf, size_t len);

/* A context on the live GPU for command (cli/live.c). Without one it says
 * that the command needs a GPU, and what works offline. 0, or -1 after the
 * error was printed. */
int cli_live_context(fg_context **ctx, const char *command);

/* The GPU commands' start (cli/live.c): a context on the live GPU and the
 * device for the problem's memory. 0, or -1 after the error was printed. */
int cli_open_live(fg_context **ctx, fgh_device *d, const char *command);
void cli_close_live(fg_context *ctx, fgh_device *d);

/* The host inputs of a problem p sized for spec and pb (cli/live.c): inputs
 * uniform in [-1, 1) from pb's seed, the layout's blocks (p's blocks_q x
 * blocks_k) kept at pb's density, dO (with grads) from a second seed. 0, or
 * -1 after the error was printed. */
int cli_problem_fill(fg_context *ctx, const fg_spec *spec, const cli_problem *pb, int grads,
                     fgh_problem *p);
/* The random stream of the sequences' lengths that --varlen and --kv-cache
 * draw when none are listed: pb's seed, apart from the inputs' stream. */
void cli_lengths_rng(const cli_problem *pb, fgh_rng *rng);
/* The problem of spec and pb on the device, filled by cli_problem_fill;
 * outputs poisoned. 0, or -1 after the error was printed (the problem is
 * freed then). */
int cli_problem_setup(fg_context *ctx, const fgh_device *d, const fg_spec *spec,
                      const cli_problem *pb, int grads, fgh_problem *p);

/* One problem against the fp64 reference, with the results printed
 * (cli/check.c); the backward too with FG_PASS_BACKWARD. The exit code. */
int cli_check_problem(fg_context *ctx, const fgh_device *d, const fg_spec *spec,
                      const cli_problem *pb, fg_pass pass, int deterministic);

/* A packed batch (--varlen, cli/check_packed.c) and a decoding step
 * (--kv-cache, cli/check_paged.c) of o's options, each sequence against its
 * own fp64 reference, with the results printed. The exit code. */
int cli_check_packed(fg_context *ctx, const fgh_device *d, const cli_options *o);
int cli_check_paged(fg_context *ctx, const fgh_device *d, const cli_options *o);

/* What the checks share (cli/check.c). cli_check_failed prints "check: "
 * and why, and returns 0; cli_check_ran is 1 when st is FG_OK and the
 * kernels ran (else 0 after saying why, the kernel's failure as `kernel`). */
int cli_check_failed(const char *why);
int cli_check_ran(fg_context *ctx, const fgh_device *d, fg_status st, const char *kernel);
/* "check <label>: |O-ref|/|ref| = ... : PASS" */
void cli_print_forward(const char *label, const fgh_forward_check *r, fg_dtype dtype);
/* Per-sequence forward checks: a sequence that fails is printed as it
 * comes, the worst (by error over bound) at the end. Start with
 * {.worst_sequence = -1}. */
typedef struct cli_sequences {
    int count, failed;
    int worst_sequence;
    double worst;
    fgh_forward_check worst_check;
    char worst_label[128];
} cli_sequences;
void cli_sequence_result(cli_sequences *s, int b, const char *label, const fgh_forward_check *r,
                         fg_dtype dtype);
/* Prints the worst and the summary; 1 when every sequence passed. */
int cli_sequences_end(const cli_sequences *s, fg_dtype dtype);
/* The backward b of p once, or twice with b->deterministic: dQ, dK and dV
 * of each run (B, H, S, D; dV's D the value head dim) into runs[run] (free
 * them with cli_free_runs either way), with d_sinks (not NULL: spec.sinks)
 * the sinks' gradient of each run into d_sinks[run] (Hq), and in *differ
 * the values the two runs do not share bit for bit. 1, or 0 after the
 * error was printed. */
int cli_backward_runs(fg_context *ctx, const fgh_device *d, fgh_problem *p,
                      const fg_backward_args *b, double *runs[2][FGH_GRADS], double *d_sinks[2],
                      size_t *differ);
void cli_free_runs(double *runs[2][FGH_GRADS]);
/* Two (Hq) arrays for the runs' sinks' gradients (free them either way); 1,
 * or 0 after the error was printed. */
int cli_sinks_alloc(const fgh_problem *p, double *d_sinks[2]);
/* "check backward <schedule>: d_sinks ...: PASS" (and each head when it
 * failed); 1 when x is within e's bounds. */
int cli_sinks_result(const char *schedule, const fgh_sinks_expect *e, const double *x);

int cli_check(const cli_options *o);
int cli_bench(const cli_options *o);
/* bench --varlen (cli/bench_varlen.c) and bench --kv-cache
 * (cli/bench_decode.c) on the live GPU of ctx and d. The exit code. */
int cli_bench_varlen(fg_context *ctx, const fgh_device *d, const cli_options *o);
int cli_bench_decode(fg_context *ctx, const fgh_device *d, const cli_options *o);
/* flashgen bench --variants (cli/bench_variants.c), over head dims dims and
 * lengths lens. */
int cli_bench_variants(fg_context *ctx, const fgh_device *d, const cli_options *o, const int *dims,
                       int nd, const int *lens, int nl);
/* The bench tables' head dim (cli/bench.c): "128", or with --head-dim-v
 * (o->spec.head_dim_v) "192/128", in the d column's width, which
 * cli_bench_dim_width gives; cli_bench_csv_v the CSV rows' last field,
 * ",128" with --head-dim-v, else "". */
const char *cli_bench_dim(const cli_options *o, int head_dim, char *buf, size_t len);
int cli_bench_dim_width(const cli_options *o);
const char *cli_bench_csv_v(const cli_options *o, char *buf, size_t len);
int cli_demo(const cli_options *o);
int cli_compile(const cli_options *o);
int cli_tune(const cli_options *o);

/* flashgen bench --philox (cli/philox.c): the forward's MMAs of a key tile at
 * head_dim alone, its Philox calls alone, and both in the same warps. */
typedef struct philox_overlap {
    double mma_ms, rng_ms, both_ms;
    double calls_per_ms; /* Philox4x32-10 calls, from the Philox-only kernel */
    double calls_per_clock_sm; /* the same per SM and clock, at the device's rated clock */
} philox_overlap;

int philox_overlap_measure(const cuda_driver *cu, CUdevice dev, int head_dim, philox_overlap *out,
                           char *err, size_t err_len);

/* flashgen cache list|stats|verify|clear (cli/cache.c): argv after "cache".
 * Returns the exit code. */
int cli_cache(int argc, char **argv);

/* flashgen bundle build|verify (cli/bundle.c): argv after "bundle". Returns
 * the exit code. */
int cli_bundle(int argc, char **argv);
/* flashgen bundle build (cli/bundle_build.c): argv after "build". */
int cli_bundle_build(int argc, char **argv);

#endif
