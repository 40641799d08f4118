/*
 * examples-c/offload.c: offload KV-cache blocks to a kvtier store and bring them back.
 *
 *   cc -std=c11 -Iinclude examples-c/offload.c -Ltarget/release -lkvtier -o offload
 *
 * The engine owns a host pool of fixed-size blocks. kvtier copies blocks to the store
 * ("store" jobs) and from the store into any free block ("load" jobs). Jobs run in the
 * background: submit, then poll for results. Exits 0 when the restored bytes match.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, poll */
#include "kvtier.h"

#include <ftw.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { NUM_BLOCKS = 8, BLOCK_BYTES = 16 * 1024, N = 4 };

/* Waits up to 10 s for one job's result. The event fd is readable while results are
 * queued, so it works with poll(2), select(2) and level- or edge-triggered epoll. */
static int wait_for(kvt_tier *tier, uint64_t job_id)
{
    struct pollfd pfd = {0};
    pfd.fd = kvt_tier_event_fd(tier);
    pfd.events = POLLIN;
    for (time_t deadline = time(NULL) + 10; time(NULL) < deadline;) {
        kvt_result res[4];
        size_t n = 0;
        poll(&pfd, 1, 100);
        if (kvt_tier_poll(tier, res, 4, &n) != KVT_STATUS_OK) {
            fprintf(stderr, "poll: %s\n", kvt_last_error());
            return 0;
        }
        for (size_t i = 0; i < n; i++) {
            /* key_status and message stay valid until the next kvt_tier_poll. */
            printf("job %llu: %s, %zu keys, %llu bytes in %.3f s %s\n", (unsigned long long)res[i].job_id,
                   kvt_status_str(res[i].status), res[i].num_keys, (unsigned long long)res[i].bytes,
                   res[i].seconds, res[i].message);
            if (res[i].job_id == job_id) {
                return res[i].status == KVT_STATUS_OK;
            }
        }
    }
    fprintf(stderr, "job %llu: no result\n", (unsigned long long)job_id);
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st, (void)ftw;
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

int main(void)
{
    char dir[] = "/tmp/kvtier-example-XXXXXX", config[256];
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    /* 1. A tier on a local directory (S3 works the same way, with another "store"). */
    snprintf(config, sizeof config, "{\"store\":{\"type\":\"local\",\"path\":\"%s\"}}", dir);
    kvt_tier *tier = NULL;
    if (kvt_tier_new(config, &tier) != KVT_STATUS_OK) {
        fprintf(stderr, "kvt_tier_new: %s\n", kvt_last_error());
        return 1;
    }

    /* 2. Register the host pool: block i is pool + i * BLOCK_BYTES. It must stay valid
     *    until kvt_tier_free returns. */
    uint8_t *pool = malloc((size_t)NUM_BLOCKS * BLOCK_BYTES);
    if (pool == NULL) {
        return 1;
    }
    for (size_t i = 0; i < (size_t)NUM_BLOCKS * BLOCK_BYTES; i++) {
        pool[i] = (uint8_t)(i * 31 + i / BLOCK_BYTES);
    }
    int ok = kvt_tier_register_memory(tier, pool, NUM_BLOCKS, BLOCK_BYTES) == KVT_STATUS_OK;

    /* 3. One key per block: a 32-byte block hash then a 4-byte big-endian group index,
     *    all keys back to back in one buffer. */
    uint8_t keys[N * KVT_DEFAULT_KEY_BYTES] = {0};
    for (int k = 0; k < N; k++) {
        memset(keys + k * KVT_DEFAULT_KEY_BYTES, 0xA0 + k, KVT_DEFAULT_KEY_BYTES - KVT_KEY_GROUP_BYTES);
    }

    /* 4. Offload blocks 0..3. Don't modify them until the job's result is polled. */
    uint64_t src[N] = {0, 1, 2, 3};
    ok = ok && kvt_tier_submit_store(tier, 1, src, keys, KVT_DEFAULT_KEY_BYTES, N) == KVT_STATUS_OK;
    ok = ok && wait_for(tier, 1);

    /* 5. Restore them into blocks 7, 6, 5, 4 (key i goes to dst[i]). Don't touch those
     *    blocks until the result is polled. */
    uint64_t dst[N] = {7, 6, 5, 4};
    ok = ok && kvt_tier_submit_load(tier, 2, dst, keys, KVT_DEFAULT_KEY_BYTES, N) == KVT_STATUS_OK;
    ok = ok && wait_for(tier, 2);
    if (!ok) {
        fprintf(stderr, "failed: %s\n", kvt_last_error());
    }

    /* 6. Check the bytes. */
    for (int k = 0; ok && k < N; k++) {
        if (memcmp(pool + dst[k] * BLOCK_BYTES, pool + src[k] * BLOCK_BYTES, BLOCK_BYTES) != 0) {
            fprintf(stderr, "block %llu differs\n", (unsigned long long)dst[k]);
            ok = 0;
        }
    }

    /* 7. Free the tier (waits for anything in flight), then the pool and the store. */
    kvt_tier_free(tier);
    free(pool);
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    printf("%s\n", ok ? "restored blocks match" : "FAILED");
    return ok ? 0 : 1;
}
