/*
 * ffi-tests/harness/framework.c: the harness's tiny test framework.
 *
 * The assertion counters and the functions behind CHECK, CHECKF and CHECK_STATUS (a
 * failure prints its place, its expression and kvt_last_error()); the settings main.c
 * reads from the environment; the monotonic clock and deadline scaling; the xorshift64*
 * generator of block contents and keys; malloc that cannot fail.
 */
#include "harness.h"

#include <stdarg.h>
#include <time.h>

long g_checks;         /* assertions evaluated, whole run */
long g_check_failures; /* assertions failed, whole run */
int g_case_failures;   /* assertions failed in the current case */

/* Set by main.c from the environment. */
int g_small; /* KVT_HARNESS_SMALL */
int g_timeout_scale = 1;
uint64_t g_seed = 0x6b7674696572ULL;
uint64_t g_rng;

/* Counts a failed assertion, for the run and for the current case, and prints it. */
static void record_failure(const char *file, int line, const char *what, const char *last_error)
{
    g_check_failures++;
    g_case_failures++;
    printf("    FAIL %s:%d: %s\n         kvt_last_error(): \"%s\"\n", file, line, what,
           last_error ? last_error : "(null)");
    fflush(stdout);
}

/* Every CHECK reads kvt_last_error() right after its expression, before any other kvt_
 * call, so the message printed for a failing call is that call's own. */
int check_impl(int ok, const char *expr, const char *file, int line)
{
    g_checks++;
    if (!ok) {
        record_failure(file, line, expr, kvt_last_error());
    }
    return ok;
}

int checkf_impl(int ok, const char *expr, const char *file, int line, const char *fmt, ...)
{
    g_checks++;
    if (!ok) {
        char context[512];
        char what[1024];
        const char *last_error = kvt_last_error();
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(context, sizeof context, fmt, ap);
        va_end(ap);
        snprintf(what, sizeof what, "%s  [%s]", expr, context);
        record_failure(file, line, what, last_error);
    }
    return ok;
}

/* A call's status: must equal `want`; a failure must come with a non-empty
 * kvt_last_error(), a success with "" (as the header promises). */
int check_status_impl(int got, int want, const char *expr, const char *file, int line)
{
    const char *last_error = kvt_last_error();
    int ok = got == want;
    char what[1024];
    g_checks++;
    if (ok && want != KVT_STATUS_OK && (last_error == NULL || last_error[0] == '\0')) {
        snprintf(what, sizeof what, "%s returned %d (%s) as expected, but kvt_last_error() is empty",
                 expr, got, kvt_status_str(got));
        ok = 0;
    } else if (ok && want == KVT_STATUS_OK && (last_error == NULL || last_error[0] != '\0')) {
        snprintf(what, sizeof what, "%s succeeded, but kvt_last_error() is not \"\" afterwards", expr);
        ok = 0;
    } else if (!ok) {
        snprintf(what, sizeof what, "%s returned %d (%s), want %d (%s)", expr, got, kvt_status_str(got), want,
                 kvt_status_str(want));
    }
    if (!ok) {
        record_failure(file, line, what, last_error);
    }
    return ok;
}

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int scaled_ms(int ms) { return ms * g_timeout_scale; }

/* xorshift64*: deterministic block contents and keys. */
uint64_t rng_next(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1DULL;
}

void rng_fill(uint8_t *dst, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint64_t v = rng_next();
        size_t k;
        for (k = 0; k < 8 && i < n; k++, i++) {
            dst[i] = (uint8_t)(v >> (8 * k));
        }
    }
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}
