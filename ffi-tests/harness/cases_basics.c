/*
 * ffi-tests/harness/cases_basics.c: the calls that need no working tier.
 *
 * The library's version against the header's, and the status strings (22 contiguous codes,
 * each its own text, "unknown status" past them); a NULL tier given to every function;
 * the rules of kvt_last_error(): set by a failure, kept by reads and by the
 * static-string functions, "" after any successful call.
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* Version and status strings                                                           */
/* ------------------------------------------------------------------------------------ */

void test_version(void)
{
    const char *v = kvt_version();
    int major = -1, minor = -1, patch = -1;
    char expect[64];
    REQUIRE(v != NULL);
    CHECKF(strcmp(v, KVTIER_VERSION) == 0, "kvt_version() \"%s\", header \"%s\"", v, KVTIER_VERSION);
    CHECK(sscanf(v, "%d.%d.%d", &major, &minor, &patch) == 3);
    CHECK(major == KVTIER_VERSION_MAJOR);
    CHECK(minor == KVTIER_VERSION_MINOR);
    CHECK(patch == KVTIER_VERSION_PATCH);
    snprintf(expect, sizeof expect, "%d.%d.%d", KVTIER_VERSION_MAJOR, KVTIER_VERSION_MINOR, KVTIER_VERSION_PATCH);
    CHECK(strcmp(expect, KVTIER_VERSION) == 0);
    CHECK(kvt_version() == v); /* static storage */
}

void test_status_str(void)
{
    static const int codes[] = {
        KVT_STATUS_OK,           KVT_STATUS_NULL_ARGUMENT,   KVT_STATUS_INVALID_ARGUMENT,
        KVT_STATUS_CONFIG,       KVT_STATUS_CONNECT,         KVT_STATUS_IO,
        KVT_STATUS_NOT_FOUND,    KVT_STATUS_STATE,           KVT_STATUS_PANIC,
        KVT_STATUS_DUPLICATE_JOB, KVT_STATUS_SHUT_DOWN,      KVT_STATUS_CANCELLED,
        KVT_STATUS_TIMEOUT,      KVT_STATUS_LENGTH_MISMATCH, KVT_STATUS_CORRUPT,
        KVT_STATUS_AUTH,         KVT_STATUS_PERMISSION_DENIED, KVT_STATUS_BUCKET_NOT_FOUND,
        KVT_STATUS_TLS,          KVT_STATUS_FORKED,          KVT_STATUS_BLOCK_BUSY,
        KVT_STATUS_UNDECRYPTABLE,
    };
    const size_t n = sizeof codes / sizeof codes[0];
    const char *unknown = kvt_status_str(-1);
    size_t i, j;
    CHECK(n == 22);
    for (i = 0; i < n; i++) {
        const char *s = kvt_status_str(codes[i]);
        CHECKF(codes[i] == (int)i, "code %d at position %zu: the ABI numbers are contiguous", codes[i], i);
        if (!CHECKF(s != NULL && s[0] != '\0', "kvt_status_str(%d)", codes[i])) {
            continue;
        }
        CHECKF(unknown == NULL || strcmp(s, unknown) != 0, "kvt_status_str(%d) = \"%s\"", codes[i], s);
        for (j = 0; j < i; j++) {
            CHECKF(strcmp(s, kvt_status_str(codes[j])) != 0, "codes %d and %d share \"%s\"", codes[i], codes[j], s);
        }
    }
    CHECK(strcmp(kvt_status_str(KVT_STATUS_OK), "ok") == 0);
    REQUIRE(unknown != NULL);
    CHECK(strcmp(unknown, "unknown status") == 0);
    CHECK(strcmp(kvt_status_str(22), "unknown status") == 0);
    CHECK(strcmp(kvt_status_str(1000000), "unknown status") == 0);
}

/* ------------------------------------------------------------------------------------ */
/* A NULL tier; kvt_last_error()                                                        */
/* ------------------------------------------------------------------------------------ */

/* NULL tier to every function. */
void test_null_tier(void)
{
    uint8_t pool[64], keys[KEY_LEN] = {0};
    uint64_t ids[1] = {0};
    kvt_result buf[2];
    size_t n = 77;

    CHECK_STATUS(kvt_tier_register_memory(NULL, pool, 1, sizeof pool), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store(NULL, 1, ids, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load(NULL, 1, ids, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(NULL, buf, 2, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    n = 77;
    CHECK_STATUS(kvt_tier_poll(NULL, NULL, 0, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_poll(NULL, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_drain(NULL, 0), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_shutdown(NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(kvt_tier_event_fd(NULL) == -1);
    CHECK(kvt_last_error()[0] != '\0');
    CHECK(kvt_tier_jobs_in_flight(NULL) == 0);
    CHECK(kvt_last_error()[0] != '\0');
    CHECK(kvt_tier_location(NULL) == NULL);
    CHECK(kvt_last_error()[0] != '\0');
    kvt_tier_free(NULL); /* no-op */
    CHECK(kvt_last_error()[0] == '\0');
}

/* kvt_last_error(): set by a failure, "" after any successful call. */
void test_last_error(void)
{
    kvt_tier *t = NULL;
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"zzz\":1}", &t), KVT_STATUS_CONFIG);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL); /* reading it does not clear it */
    (void)kvt_version();
    (void)kvt_status_str(3);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL); /* nor do the static-string functions */
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"}}", &t), KVT_STATUS_OK);
    CHECK(kvt_last_error()[0] == '\0');
    CHECK_STATUS(kvt_tier_drain(t, 0), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_shutdown(NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(kvt_tier_jobs_in_flight(t) == 0);
    CHECK(kvt_last_error()[0] == '\0');
    kvt_tier_free(t);
}
