/* Bundles: read-only folders of precompiled kernels shipped with a program.
 *
 *   <bundle>/manifest.tsv          one line per entry (bundle_entry), written last
 *   <bundle>/<target>/<key>.fgc    entries in the store's file format (store.c),
 *                                  target as NVRTC names it: sm_86, sm_90a
 *
 * Entries are filed under the portable key: cache_key() over source, options
 * (nvrtc_portable_options), target, generator version and format, with the
 * NVRTC version left at 0.0. A program can compute it without NVRTC, so a
 * kernel found in a bundle loads with no NVRTC at all. The NVRTC that built
 * an entry is recorded in the manifest instead.
 *
 * What a bundle is, bundle_open says, for the runtime and bundle_verify
 * alike: a folder whose manifest reads (this version's first line, every
 * line well formed). Past that the runtime finds entries by key alone: the
 * key already covers target, generator and format, the file's header
 * checksum catches damage, and the payload must name the planned kernel
 * (which names the target). The manifest's columns are for bundle_verify and
 * for people. */
#ifndef FG_BUNDLE_H
#define FG_BUNDLE_H

#include <stddef.h>

#include "cache/cache.h"

#define BUNDLE_MANIFEST "manifest.tsv"
/* The manifest's first line; its number changes if the columns do. Version
 * 1 had an arch number where version 2 has the target's name. */
#define BUNDLE_MANIFEST_MAGIC "#flashgen-bundle 2"

typedef struct bundle_entry {
    char pass[16];      /* "forward" or "backward" */
    char spec[96];      /* canonical spec name (spec_name) */
    char kernel[160];   /* the kernel's name: pass, target, spec and tiles */
    char plan[64];      /* the family and its tiling, as tuning.tsv writes them:
                         * "fwd_sm80:2,4,64" */
    char target[CACHE_TARGET_SIZE]; /* "sm_86": the entry is <bundle>/<target>/<key>.fgc */
    char key[65];       /* portable key */
    char sha256[65];    /* of the whole .fgc file */
    char generator[32]; /* the generator version that generated the source */
    char nvrtc[16];     /* "13.0": the NVRTC that compiled it */
    int format;         /* CACHE_FORMAT_VERSION of the file */
    char step[16];      /* "kept": what fg_compile returns; "replayed": a spilling
                         * step that fg_compile reads on its way to the kept one */
} bundle_entry;

/* One tab-separated line, no newline. Returns 0, or -1 when a text field
 * holds a tab or newline, the target is not a target name, or the line does
 * not fit. */
int bundle_entry_format(const bundle_entry *e, char *line, size_t len);

/* Parse a line made by bundle_entry_format (a trailing newline is allowed).
 * Returns 0, or -1 with the reason in why. */
int bundle_entry_parse(const char *line, bundle_entry *e, char *why, size_t why_len);

/* SHA-256 of a whole file, as 64 hex digits. Returns 0, or -1 with err. */
int bundle_file_sha256(const char *path, char hex[65], char *err, size_t err_len);

/* mkdir -p. Returns 0, or -1 with err. */
int bundle_make_dir(const char *dir, char *err, size_t err_len);

/* Write <dir>/manifest.tsv atomically: a temporary file in dir, fsync,
 * rename. Returns 0, or -1 with err. */
int bundle_manifest_write(const char *dir, const bundle_entry *entries, size_t count, char *err,
                          size_t err_len);

/* Read <dir>/manifest.tsv; a line that does not parse is an error naming it,
 * and so is a manifest of another version (one made by an older flashgen
 * must be rebuilt). *entries is malloc'ed (caller frees; NULL when empty).
 * Returns 0, or -1. */
int bundle_manifest_read(const char *dir, bundle_entry **entries, size_t *count, char *err,
                         size_t err_len);

/* A read-only view of a bundle folder for cache_store_load. Returns 0, or -1
 * with err when dir is no bundle: not a folder, or its manifest is missing,
 * unreadable, of another version (bundle_manifest_read's messages) or has a
 * line that does not parse (named). The entries' files are not read here. */
int bundle_open(cache_store *s, const char *dir, char *err, size_t err_len);

/* ---- verification ---- */
typedef enum bundle_verdict {
    BUNDLE_ENTRY_OK = 0,
    BUNDLE_ENTRY_SKIPPED,  /* another target, format or generator: never looked up here */
    BUNDLE_ENTRY_REJECTED  /* missing, damaged, misplaced or lying: never loaded */
} bundle_verdict;

/* Called once per manifest line and per .fgc file the manifest does not
 * list (entry->kernel then is what the file holds, or empty). line is the
 * manifest line number, 0 for such files. note says why, "" when OK. */
typedef void (*bundle_check_fn)(const bundle_entry *entry, int line, bundle_verdict verdict,
                                const char *note, void *user);

typedef struct bundle_verify_result {
    size_t ok, skipped, rejected;
    size_t unlisted; /* .fgc files not in the manifest (also counted above) */
} bundle_verify_result;

/* Check every entry: its file exists, hashes to the manifest's sha256,
 * passes the store's own checks, holds the kernel the manifest names, built
 * for the folder's target (the kernel name names it; the cubin header's SM
 * number, which does not tell sm_90a from sm_90, matches). generator is the
 * version of the generator whose lookups the bundle serves (the runtime's
 * FG_GENERATOR_VERSION): entries of another generator version or format,
 * or for a target other than only_target (unless NULL or ""), are never
 * looked up and are skipped with a note. Files no line lists are checked
 * the same way and reported too. Returns 0 when dir is a bundle
 * (bundle_open; the verdicts are in result), or -1 with err: no bundle (what
 * bundle_open refuses, the runtime passes over too), no generator version,
 * or only_target not a target name. */
int bundle_verify(const char *dir, const char *generator, const char *only_target,
                  bundle_check_fn fn, void *user, bundle_verify_result *result, char *err,
                  size_t err_len);

#endif
