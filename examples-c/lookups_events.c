/*
 * examples-c/lookups_events.c: the scheduler side of a tier: non-blocking lookups that
 * answer RETRY until the tier knows, and the BlockStored events of successful stores.
 *
 *   cc -std=c11 -Iinclude examples-c/lookups_events.c -Ltarget/release -lkvtier -o lookups_events
 *
 * One scheduler step = lookups for the running requests, then kvt_tier_schedule_end(),
 * which sends the step's unknown keys, deduplicated across requests, to the store as one
 * batch of concurrent existence checks. Exits 0 when every verdict and event is right.
 */
#define _XOPEN_SOURCE 700
#include "kvtier.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

enum { BLOCK_BYTES = 4096, NUM_BLOCKS = 4, KEY = KVT_DEFAULT_KEY_BYTES };

static void make_key(uint8_t key[KEY], uint8_t seed)
{
    memset(key, seed, KEY - KVT_KEY_GROUP_BYTES); /* the block hash */
    memset(key + KEY - KVT_KEY_GROUP_BYTES, 0, KVT_KEY_GROUP_BYTES); /* group 0, big-endian */
}

static void sleep_ms(long ms)
{
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

int main(void)
{
    static uint8_t pool[NUM_BLOCKS * BLOCK_BYTES];
    uint8_t stored[2 * KEY], absent[KEY];
    const uint64_t blocks[2] = {0, 1};
    kvt_tier *tier = NULL;
    kvt_result results[4];
    kvt_event events[4];
    size_t n = 0;
    int ok = 1;

    if (kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"enable_kv_events\":true,\"locality\":\"LOCAL\"}", &tier) !=
            KVT_STATUS_OK ||
        kvt_tier_register_memory(tier, pool, NUM_BLOCKS, BLOCK_BYTES) != KVT_STATUS_OK) {
        fprintf(stderr, "setup: %s\n", kvt_last_error());
        kvt_tier_free(tier);
        return 1;
    }
    make_key(stored, 0xa1);
    make_key(stored + KEY, 0xa2);
    make_key(absent, 0xb0);

    /* Store two blocks; the successful job yields exactly one event with both keys. */
    kvt_tier_submit_store(tier, 1, blocks, stored, KEY, 2);
    kvt_tier_drain(tier, 10000);
    kvt_tier_poll(tier, results, 4, &n);
    ok &= n == 1 && results[0].status == KVT_STATUS_OK;
    kvt_tier_take_events(tier, events, 4, &n);
    ok &= n == 1 && events[0].num_keys == 2 && memcmp(events[0].keys, stored, 2 * KEY) == 0 &&
          strcmp(events[0].medium, "STORAGE") == 0 && events[0].locality == KVT_LOCALITY_LOCAL;
    printf("event: job %llu stored %zu keys on %s\n", (unsigned long long)events[0].job_id, events[0].num_keys,
           events[0].medium);

    /* Request 7 asks about a stored and an absent key: RETRY until a step has ended. */
    kvt_lookup_result hit = KVT_LOOKUP_RESULT_RETRY, miss = KVT_LOOKUP_RESULT_RETRY;
    for (int step = 0; step < 5000 && (hit == KVT_LOOKUP_RESULT_RETRY || miss == KVT_LOOKUP_RESULT_RETRY); step++) {
        kvt_tier_lookup(tier, 7, stored, KEY, &hit);
        kvt_tier_lookup(tier, 7, absent, KEY, &miss);
        kvt_tier_schedule_end(tier); /* end of the scheduler step */
        sleep_ms(1);
    }
    printf("lookup: stored key %s, absent key %s\n", hit == KVT_LOOKUP_RESULT_HIT ? "HIT" : "not HIT",
           miss == KVT_LOOKUP_RESULT_MISS ? "MISS" : "not MISS");
    ok &= hit == KVT_LOOKUP_RESULT_HIT && miss == KVT_LOOKUP_RESULT_MISS;

    /* Verdicts are cached until the request finishes: asking again costs no I/O. */
    kvt_stats before, after;
    kvt_tier_stats(tier, &before, sizeof before);
    kvt_tier_lookup(tier, 7, stored, KEY, &hit);
    kvt_tier_schedule_end(tier);
    kvt_tier_stats(tier, &after, sizeof after);
    ok &= after.existence_checks == before.existence_checks;
    kvt_tier_request_finished(tier, 7);

    kvt_tier_free(tier);
    printf("%s\n", ok ? "lookups and events as expected" : "UNEXPECTED RESULT");
    return ok ? 0 : 1;
}
