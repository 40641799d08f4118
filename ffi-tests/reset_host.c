/*
 * ffi-tests/reset_host.c: a C engine that leaves SIGPIPE at its default action (as most C
 * and C++ hosts do), for python/tests/test_c_host_resets.py.
 *
 *   reset_host CONFIG_JSON BLOCK_BYTES ROUNDS
 *
 * In each of ROUNDS rounds it stores BLOCKS blocks (each under a key of its own, in jobs of
 * one key, all in flight at once), then loads every key whose store succeeded into a
 * cleared block and checks every byte. The test runs it through a proxy that resets
 * connections part-way: the host must live through every reset (a write to a reset
 * connection raises SIGPIPE in the writing thread unless the library keeps it off), get
 * exactly one result per job, and never a wrong byte from a load reported OK.
 *
 * Output: one line "RESET_HOST {json}" with the counts (and the tier's retries and
 * direct-path fallbacks); exit status 0 when every job had
 * one result and no load reported OK had a wrong byte, 1 otherwise, 2 on a setup error.
 */
#define _GNU_SOURCE
#include "kvtier.h"

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { BLOCKS = 32, KEY = 36, MAX_ROUNDS = 1000 };

static uint8_t byte_of(uint64_t round, uint64_t block, size_t at)
{
    uint64_t z = (round * 0x9E3779B97F4A7C15ULL) ^ (block * 0xBF58476D1CE4E5B9ULL) ^ (uint64_t)at;
    z ^= z >> 29;
    return (uint8_t)(z * 0x94D049BB133111EBULL >> 56);
}

static void key_of(uint8_t *key, uint64_t run, uint64_t round, uint64_t block)
{
    memset(key, 0, KEY);
    memcpy(key, &run, 8);
    memcpy(key + 8, &round, 8);
    memcpy(key + 16, &block, 8);
}

/* Polls until `want` results have come; records each job's status in `status_of`
 * (indexed by job id - first_job). Returns 0, or 1 on a duplicate or unknown result. */
static int collect(kvt_tier *tier, uint64_t first_job, size_t want, int *status_of, int *seen)
{
    size_t got = 0;
    while (got < want) {
        struct pollfd p = {kvt_tier_event_fd(tier), POLLIN, 0};
        poll(&p, 1, 1000);
        kvt_result results[BLOCKS];
        size_t n = 0;
        if (kvt_tier_poll(tier, results, BLOCKS, &n) != KVT_STATUS_OK) {
            fprintf(stderr, "poll: %s\n", kvt_last_error());
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            uint64_t at = results[i].job_id - first_job;
            if (results[i].job_id < first_job || at >= want || seen[at]) {
                fprintf(stderr, "unexpected result for job %" PRIu64 "\n", results[i].job_id);
                return 1;
            }
            seen[at] = 1;
            status_of[at] = results[i].status;
        }
        got += n;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CONFIG_JSON BLOCK_BYTES ROUNDS\n", argv[0]);
        return 2;
    }
    size_t block = (size_t)strtoull(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    if (block == 0 || rounds <= 0 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bad BLOCK_BYTES or ROUNDS\n");
        return 2;
    }
    kvt_tier *tier = NULL;
    if (kvt_tier_new(argv[1], &tier) != KVT_STATUS_OK) {
        fprintf(stderr, "kvt_tier_new: %s\n", kvt_last_error());
        return 2;
    }
    uint8_t *pool = malloc(block * BLOCKS);
    if (pool == NULL || kvt_tier_register_memory(tier, pool, BLOCKS, block) != KVT_STATUS_OK) {
        fprintf(stderr, "register: %s\n", kvt_last_error());
        return 2;
    }
    uint64_t run = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    uint64_t job = 1;
    long stored = 0, store_failed = 0, loaded = 0, load_failed = 0, wrong = 0;
    int bad = 0;
    for (int r = 0; r < rounds && !bad; r++) {
        int status_of[BLOCKS], seen[BLOCKS] = {0};
        uint64_t first = job;
        for (uint64_t b = 0; b < BLOCKS; b++) {
            for (size_t at = 0; at < block; at++) {
                pool[b * block + at] = byte_of((uint64_t)r, b, at);
            }
            uint8_t key[KEY];
            key_of(key, run, (uint64_t)r, b);
            kvt_tier_submit_store(tier, job++, &b, key, KEY, 1);
        }
        bad |= collect(tier, first, BLOCKS, status_of, seen);
        int stored_ok[BLOCKS];
        for (int b = 0; b < BLOCKS; b++) {
            stored_ok[b] = status_of[b] == KVT_STATUS_OK;
            stored += stored_ok[b];
            store_failed += !stored_ok[b];
        }
        memset(pool, 0, block * BLOCKS);
        memset(seen, 0, sizeof seen);
        first = job;
        size_t loads = 0;
        uint64_t block_of[BLOCKS];
        for (uint64_t b = 0; b < BLOCKS; b++) {
            if (!stored_ok[b]) {
                continue;
            }
            uint8_t key[KEY];
            key_of(key, run, (uint64_t)r, b);
            block_of[loads++] = b;
            kvt_tier_submit_load(tier, job++, &b, key, KEY, 1);
        }
        bad |= collect(tier, first, loads, status_of, seen);
        for (size_t i = 0; i < loads; i++) {
            if (status_of[i] != KVT_STATUS_OK) {
                load_failed++;
                continue;
            }
            loaded++;
            uint64_t b = block_of[i];
            for (size_t at = 0; at < block; at++) {
                if (pool[b * block + at] != byte_of((uint64_t)r, b, at)) {
                    wrong++;
                    break;
                }
            }
        }
    }
    kvt_stats stats;
    memset(&stats, 0, sizeof stats);
    kvt_tier_stats(tier, &stats, sizeof stats);
    kvt_tier_free(tier);
    free(pool);
    printf("RESET_HOST {\"stored\": %ld, \"store_failed\": %ld, \"loaded\": %ld, \"load_failed\": %ld, "
           "\"wrong\": %ld, \"retries\": %" PRIu64 ", \"direct_fallbacks\": %" PRIu64 ", \"one_result_each\": %s}\n",
           stored, store_failed, loaded, load_failed, wrong, stats.retries, stats.direct_fallbacks,
           bad ? "false" : "true");
    return bad || wrong ? 1 : 0;
}
