/*
 * ffi-tests/harness/cases_config.c: making a tier from a configuration.
 *
 * kvt_tier_new with NULL arguments and bad configurations (bad JSON, unknown keys, bad
 * values, malformed endpoints: CONFIG, a message naming the culprit, *out_tier NULL); a
 * local store that cannot take files, refused at once; key_bytes 0 (any key length from
 * 5 to 68 bytes); kvt_vllm_namespace, the namespace derived from vLLM's fields.
 */
#include "harness.h"

#include "cases.h"

#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ */
/* Bad configurations and stores                                                        */
/* ------------------------------------------------------------------------------------ */

/* kvt_tier_new: NULL arguments and bad configurations. */
void test_config_errors(void)
{
    static const struct {
        const char *json;
        const char *must_mention; /* NULL: any non-empty message */
    } bad[] = {
        {"", NULL},
        {"{", NULL},
        {"not json", NULL},
        {"[]", NULL},
        {"{}", "store"},
        {"{\"store\":{\"type\":\"memory\"},\"prefx\":\"a\"}", "prefx"},
        {"{\"store\":{\"type\":\"memory\"},\"bogus_key\":1}", "bogus_key"},
        {"{\"store\":{\"type\":\"memory\",\"colour\":1}}", "colour"},
        {"{\"store\":{\"type\":\"ftp\"}}", "ftp"},
        {"{\"store\":{\"type\":\"memory\"},\"runtime_threads\":0}", "runtime_threads"},
        {"{\"store\":{\"type\":\"memory\"},\"key_bytes\":3}", "key_bytes"},
        {"{\"store\":{\"type\":\"memory\"},\"prefix\":\"a|b\"}", "prefix"},
        {"{\"store\":{\"type\":\"memory\"},\"key_bytes\":\"36\"}", NULL},
        /* Malformed endpoints are configuration errors found before any request (with
         * explicit keys and with the credential chain). */
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://[::1\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://[::1\"}}",
         "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://127.0.0.1:99999\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"ht!tp://x\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"ftp://host:21\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"host:port\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://a b:9000\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://:9000\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
    };
    size_t i;
    kvt_tier *t;
    uint8_t bad_utf8[] = {'{', '"', 0xff, 0xfe, '"', '}', 0};

    t = (kvt_tier *)&t; /* a non-NULL sentinel: must be reset to NULL */
    CHECK_STATUS(kvt_tier_new(NULL, &t), KVT_STATUS_NULL_ARGUMENT);
    CHECK(t == NULL);
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"}}", NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_new(NULL, NULL), KVT_STATUS_NULL_ARGUMENT);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = (kvt_tier *)&t;
        if (CHECKF(kvt_tier_new(bad[i].json, &t) == KVT_STATUS_CONFIG, "config '%s'", bad[i].json)) {
            const char *e = kvt_last_error();
            CHECKF(e[0] != '\0', "config '%s': empty message", bad[i].json);
            if (bad[i].must_mention) {
                CHECKF(strstr(e, bad[i].must_mention) != NULL, "config '%s': message \"%s\" does not name \"%s\"",
                       bad[i].json, e, bad[i].must_mention);
            }
        }
        CHECKF(t == NULL, "config '%s': *out_tier not reset to NULL", bad[i].json);
        if (t != NULL && t != (kvt_tier *)&t) {
            kvt_tier_free(t);
        }
    }
    t = (kvt_tier *)&t;
    CHECK_STATUS(kvt_tier_new((const char *)bad_utf8, &t), KVT_STATUS_CONFIG);
    CHECK(t == NULL);

    /* A good configuration afterwards works, and clears the last error. */
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"key_bytes\":0,\"runtime_threads\":1,"
                              "\"max_inflight_transfers\":4,\"max_inflight_lookups\":4,"
                              "\"shutdown_timeout_ms\":100,\"prefix\":\"a/b\",\"namespace\":\"ns\"}",
                              &t),
                 KVT_STATUS_OK);
    CHECK(t != NULL);
    kvt_tier_free(t);
}

/* A local store that cannot take files fails at kvt_tier_new, naming the directory,
 * instead of failing every store job later. */
void test_local_unwritable(void)
{
    char dir[512], json[1024];
    kvt_tier *t = (kvt_tier *)&t;
    kvt_status s;

    s = kvt_tier_new("{\"store\":{\"type\":\"local\",\"path\":\"/proc/1\"}}", &t);
    CHECKF(s == KVT_STATUS_CONFIG || s == KVT_STATUS_PERMISSION_DENIED, "/proc/1: returned %d (%s)", (int)s,
           kvt_status_str(s));
    CHECKF(strstr(kvt_last_error(), "/proc/1") != NULL && strstr(kvt_last_error(), "writable") != NULL,
           "message \"%s\"", kvt_last_error());
    CHECK(t == NULL);
    if (t != NULL && t != (kvt_tier *)&t) {
        kvt_tier_free(t);
    }
    /* A read-only directory (permissions do not bind root, so only as another user). */
    if (geteuid() != 0 && make_temp_dir(dir, sizeof dir)) {
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s\"}}", dir);
        CHECK(chmod(dir, 0555) == 0);
        t = NULL;
        CHECK_STATUS(kvt_tier_new(json, &t), KVT_STATUS_PERMISSION_DENIED);
        CHECK(t == NULL);
        kvt_tier_free(t);
        chmod(dir, 0755);
        rm_rf(dir);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Key lengths and namespaces                                                           */
/* ------------------------------------------------------------------------------------ */

/* key_bytes 0 accepts any key length from 5 to 68 bytes (a 1..64-byte hash and the group);
 * others fail with a result. */
void test_key_bytes_any(void)
{
    static const size_t lens[] = {5, 6, 7, 8, 20, 36, 68};
    fixture f;
    uint8_t keys[72]; /* room for the 69-byte key below */
    size_t i;
    owned_result r;
    if (!fixture_open(&f, "local", 2 * 7, 4096, ",\"key_bytes\":0")) {
        fixture_close(&f);
        return;
    }
    for (i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint64_t src = i, dst = 7 + i, sid = 10 + i, lid = 20 + i;
        rng_fill(keys, sizeof keys);
        CHECK_STATUS(kvt_tier_submit_store(f.tier, sid, &src, keys, lens[i], 1), KVT_STATUS_OK);
        if (!wait_ok(&f, &sid, 1, scaled_ms(5000))) {
            continue;
        }
        CHECK_STATUS(kvt_tier_submit_load(f.tier, lid, &dst, keys, lens[i], 1), KVT_STATUS_OK);
        if (wait_ok(&f, &lid, 1, scaled_ms(5000))) {
            CHECKF(memcmp(block(&f, dst), block(&f, src), f.block_bytes) == 0, "key length %zu", lens[i]);
        }
    }
    for (i = 0; i < 2; i++) {
        uint64_t src = 0, id = 30 + i;
        size_t len = i == 0 ? 4 : 69;
        CHECKF(kvt_tier_submit_store(f.tier, id, &src, keys, len, 1) == KVT_STATUS_INVALID_ARGUMENT,
               "key length %zu", len);
        memset(&r, 0, sizeof r);
        if (expect_one_queued(&f, id, &r)) {
            CHECK(r.status == KVT_STATUS_INVALID_ARGUMENT);
        }
        free_results(&r, 1);
    }
    fixture_close(&f);
}

/* kvt_vllm_namespace: the size query, exact fits, NULLs and bad field sets. */
void test_vllm_namespace(void)
{
    const char *fields = "{\"model_name\":\"org/model-1\",\"tokens_per_hash\":16,\"tp_size\":2}";
    char buf[128];
    size_t len = 0, needed, i;
    kvt_status s;

    CHECK_STATUS(kvt_vllm_namespace(fields, 3, NULL, 0, &len), KVT_STATUS_INVALID_ARGUMENT);
    needed = len;
    REQUIRE(needed > 0 && needed < sizeof buf - 1);
    memset(buf, 'x', sizeof buf);
    CHECK_STATUS(kvt_vllm_namespace(fields, 3, buf, needed, &len), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(len == needed);
    CHECK(buf[0] == 'x'); /* nothing written when it does not fit */
    memset(buf, 'x', sizeof buf);
    CHECK_STATUS(kvt_vllm_namespace(fields, 3, buf, needed + 1, &len), KVT_STATUS_OK);
    CHECK(len == needed && buf[needed] == '\0' && strlen(buf) == needed);
    CHECK(buf[needed + 1] == 'x');
    CHECKF(strncmp(buf, "org_model-1_", 12) == 0 && strcmp(buf + needed - 3, "_r3") == 0, "namespace \"%s\"", buf);
    for (i = 12; i < 24 && i < needed; i++) {
        CHECKF(strchr("0123456789abcdef", buf[i]) != NULL, "namespace \"%s\": digest character %zu", buf, i);
    }
    CHECK_STATUS(kvt_vllm_namespace(NULL, 0, buf, sizeof buf, &len), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_vllm_namespace(fields, 0, buf, sizeof buf, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_vllm_namespace(fields, 0, NULL, 8, &len), KVT_STATUS_NULL_ARGUMENT);
    s = kvt_vllm_namespace("{not json", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "not JSON: %d", (int)s);
    s = kvt_vllm_namespace("{\"tp_size\":1}", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT && strstr(kvt_last_error(), "model_name") != NULL, "no model_name: %d %s",
           (int)s, kvt_last_error());
    s = kvt_vllm_namespace("[\"model_name\"]", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "an array: %d", (int)s);
    s = kvt_vllm_namespace("{\"model_name\":\"\xff\"}", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "not UTF-8: %d", (int)s);
}
