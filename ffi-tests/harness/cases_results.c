/*
 * ffi-tests/harness/cases_results.c: taking results.
 *
 * The event fd is stable and readable exactly while results wait (also after a partial
 * poll, and possibly a little before a finished job's result can be taken); the
 * arguments of kvt_tier_poll (NULL count, NULL buffer, capacity 0), and a queued result
 * is not lost by polls that fail or take nothing.
 */
#include "harness.h"

#include "cases.h"

/* The event fd is readable exactly while results wait, also after a partial poll. */
void test_event_fd(void)
{
    fixture f;
    kvt_result buf[4];
    size_t n = 0;
    uint64_t id0 = 0;
    uint8_t *keys = make_keys(1);
    int fd;
    if (!fixture_open(&f, "local", 1, 4096, "")) {
        goto out;
    }
    fd = kvt_tier_event_fd(f.tier);
    if (!CHECK(fd >= 0)) {
        goto out;
    }
    CHECK(kvt_tier_event_fd(f.tier) == fd); /* stable */
    CHECK(!fd_readable(fd, 0));
    /* Three results queued at once (submission failures), taken one, then two. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 2, &id0, keys, KEY_LEN, 0), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 3, &id0, keys, 5, 1), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(fd_readable(fd, 0));
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 1, &n), KVT_STATUS_OK);
    CHECK(n == 1);
    CHECK(fd_readable(fd, 0));
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
    CHECK(n == 2);
    CHECK(!fd_readable(fd, 0));
    /* A real job: poll(2) wakes up when it completes. The library makes the fd readable
     * just before it queues the result (tier.rs: finish), so a poll right after the
     * wake-up may still find nothing; the fd then stays readable (level-triggered use is
     * safe; see the report about EPOLLET). */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 4, &id0, keys, KEY_LEN, 1), KVT_STATUS_OK);
    CHECK(fd_readable(fd, scaled_ms(5000)));
    {
        int early = 0;
        double deadline = now_ms() + scaled_ms(1000);
        n = 0;
        while (CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK) && n == 0 && now_ms() < deadline) {
            early++;
            CHECK(fd_readable(fd, 0)); /* still readable while the result is on its way */
        }
        if (early > 0) {
            printf("    note: event fd was readable %d poll(s) before the result could be taken\n", early);
        }
    }
    CHECK(n == 1 && buf[0].job_id == 4 && buf[0].status == KVT_STATUS_OK);
    CHECK(!fd_readable(fd, 0));
out:
    free(keys);
    fixture_close(&f);
}

/* kvt_tier_poll argument checks; kvt_tier_free(NULL). */
void test_poll_args(void)
{
    fixture f;
    kvt_result buf[2];
    size_t n;
    uint8_t keys[KEY_LEN] = {0};
    if (!fixture_open(&f, "memory", 2, 1024, "")) {
        fixture_close(&f);
        return;
    }
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(strstr(kvt_last_error(), "out_count") != NULL);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 1, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    /* A queued result is not lost by polls that fail or have capacity 0. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 9, NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 2, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, &n), KVT_STATUS_OK);
    CHECK(n == 1 && buf[0].job_id == 9);
    kvt_tier_free(NULL);
    kvt_tier_free(NULL);
    fixture_close(&f);
}
