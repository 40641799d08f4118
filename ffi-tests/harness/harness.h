/*
 * ffi-tests/harness/harness.h: what every file of the kvtier C ABI harness shares.
 *
 * The tiny test framework (framework.c): CHECK and its kin, which count assertions and
 * print each failure with kvt_last_error(); the run's settings from the environment; a
 * monotonic clock; the deterministic generator of block contents and keys.
 *
 * The helpers around a tier (fixture.c): keys, temporary directories, the fixture (a tier
 * on a fresh store with a registered pool of random blocks), and the ways to take its
 * results (collect, wait_ok, expect_one_queued, discard_results), each result checked
 * against what every result must satisfy.
 *
 * Every .c file of the harness includes this header first: it sets the POSIX feature
 * macros before any system header. The whole harness is strict C11 plus POSIX, and also
 * compiles as C++17.
 */
#ifndef KVT_HARNESS_H
#define KVT_HARNESS_H

#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, poll, clock_gettime */
#endif
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#endif

#include "kvtier.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define KVT_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define KVT_PRINTF(fmt_index, first_arg)
#endif

/* ------------------------------------------------------------------------------------ */
/* Tiny test framework (framework.c)                                                    */
/* ------------------------------------------------------------------------------------ */

extern long g_checks;         /* assertions evaluated, whole run */
extern long g_check_failures; /* assertions failed, whole run */
extern int g_case_failures;   /* assertions failed in the current case */

extern int g_small;           /* KVT_HARNESS_SMALL */
extern int g_timeout_scale;   /* KVT_HARNESS_TIMEOUT_SCALE, 1 unless set */
extern uint64_t g_seed;       /* KVT_HARNESS_SEED */
extern uint64_t g_rng;        /* the generator's state, seeded per case by main.c */

int check_impl(int ok, const char *expr, const char *file, int line);
int checkf_impl(int ok, const char *expr, const char *file, int line, const char *fmt, ...) KVT_PRINTF(5, 6);
int check_status_impl(int got, int want, const char *expr, const char *file, int line);

#define CHECK(cond) check_impl((cond) ? 1 : 0, #cond, __FILE__, __LINE__)
#define CHECKF(cond, ...) checkf_impl((cond) ? 1 : 0, #cond, __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_STATUS(expr, want) check_status_impl((int)(expr), (int)(want), #expr, __FILE__, __LINE__)
/* Stop the current case when a precondition fails (the fixture is still cleaned up by
 * the caller of the case body). */
#define REQUIRE(cond)                                                                      \
    do {                                                                                   \
        if (!CHECK(cond))                                                                  \
            return;                                                                        \
    } while (0)

double now_ms(void);
int scaled_ms(int ms);
uint64_t rng_next(void);
void rng_fill(uint8_t *dst, size_t n);
void *xmalloc(size_t n);

/* ------------------------------------------------------------------------------------ */
/* Keys, temporary directories, the fixture (fixture.c)                                 */
/* ------------------------------------------------------------------------------------ */

enum { KEY_LEN = KVT_DEFAULT_KEY_BYTES, HASH_LEN = KVT_DEFAULT_KEY_BYTES - KVT_KEY_GROUP_BYTES };

void make_key(uint8_t *key, uint32_t group);
uint8_t *make_keys(size_t n);
void rm_rf(const char *dir);
int make_temp_dir(char *out, size_t cap);

typedef struct fixture {
    kvt_tier *tier;
    uint8_t *pool;
    uint64_t num_blocks;
    size_t block_bytes;
    char dir[512]; /* local store root ("" for a memory store); removed on close */
    char prefix[64]; /* the prefix of a KVT_HARNESS_STORE tier */
} fixture;

uint8_t *block(const fixture *f, uint64_t id);
int fixture_open(fixture *f, const char *store, uint64_t num_blocks, size_t block_bytes, const char *extra);
void fixture_close(fixture *f);
void shut_down_leftovers(const fixture *f);
int store_first_blocks(const fixture *f, uint64_t job_id, const uint8_t *keys, size_t n, int timeout_ms);

kvt_status submit_kind(kvt_tier *t, kvt_job_kind kind, uint64_t id, const uint64_t *ids, const uint8_t *keys,
                       size_t key_len, size_t n);

/* ------------------------------------------------------------------------------------ */
/* Results (fixture.c)                                                                  */
/* ------------------------------------------------------------------------------------ */

/* A copy of one kvt_result (its arrays die at the next poll). */
typedef struct owned_result {
    uint64_t job_id;
    kvt_job_kind kind;
    kvt_status status;
    uint64_t bytes;
    double seconds;
    size_t num_keys;
    size_t num_failed_keys;
    kvt_status *key_status;
    char *message;
} owned_result;

void free_results(owned_result *r, size_t n);
void free_collected(owned_result *res, size_t got, size_t cap);
void check_result_invariants(const kvt_result *r, size_t block_bytes);
void copy_result(owned_result *dst, const kvt_result *src);
int fd_readable(int fd, int timeout_ms);
size_t collect(const fixture *f, size_t want, int timeout_ms, size_t capacity, owned_result *out, size_t out_cap,
               size_t *polls);
size_t discard_results(const fixture *f);
int expect_one_queued(const fixture *f, uint64_t job_id, owned_result *out);
int wait_ok(const fixture *f, const uint64_t *ids, size_t n, int timeout_ms);

#endif /* KVT_HARNESS_H */
