/*
 * ffi-tests/harness/cases_ranges.c: regions and ranges.
 *
 * Jobs whose keys' bytes are ranges of registered regions instead of pool blocks: pages
 * of K and V ranges round trip byte-exact and are the very objects pool blocks of the
 * same bytes give; every bad region, range and count is refused with the job's one
 * result before anything is read; a load holds its bytes alone; a region is removed only
 * when no job holds it. Pages of 2 and of 2 x 32 ranges also round-trip through a second
 * tier on the store of KVT_HARNESS_STORE (ranges_on_store, which
 * ffi-tests/on_s3_servers.py runs on real S3 servers).
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* Regions and ranges on one tier                                                       */
/* ------------------------------------------------------------------------------------ */

/* Pages of K and V ranges in two regions round trip byte-exact and are the objects pool
 * blocks of the same bytes give; every bad region, range and count is refused with the
 * job's one result, before anything is read; a load holds its bytes alone; a region is
 * removed only when no job holds it; after shutdown, no new region. */
enum { RANGE_BYTES = 4096, RANGE_PAGES = 8 };

static kvt_status submit_ranges(const fixture *f, kvt_job_kind kind, uint64_t id, const kvt_range *ranges,
                                size_t per_key, const uint8_t *keys, size_t num_keys)
{
    return kind == KVT_JOB_KIND_STORE
               ? kvt_tier_submit_store_ranges(f->tier, id, ranges, per_key, keys, KEY_LEN, num_keys)
               : kvt_tier_submit_load_ranges(f->tier, id, ranges, per_key, keys, KEY_LEN, num_keys);
}

/* The page's K and V ranges. */
static void page_ranges(kvt_range *out, uint64_t k, uint64_t v, size_t page)
{
    out[0].region = k;
    out[0].offset = (uint64_t)page * RANGE_BYTES;
    out[0].len = RANGE_BYTES;
    out[1].region = v;
    out[1].offset = (uint64_t)page * RANGE_BYTES;
    out[1].len = RANGE_BYTES;
}

void test_ranges(void)
{
    fixture f;
    uint8_t *kmem = (uint8_t *)xmalloc(RANGE_PAGES * RANGE_BYTES);
    uint8_t *vmem = (uint8_t *)xmalloc(RANGE_PAGES * RANGE_BYTES);
    uint8_t *keys = make_keys(4);
    kvt_range ranges[2 * RANGE_PAGES], bad[2];
    uint64_t rk = 0, rv = 0, out = 99, job = 1, ids[4] = {0, 1, 2, 3};
    size_t p, i;
    owned_result r;
    kvt_job_kind kinds[2] = {KVT_JOB_KIND_STORE, KVT_JOB_KIND_LOAD};

    rng_fill(kmem, RANGE_PAGES * RANGE_BYTES);
    rng_fill(vmem, RANGE_PAGES * RANGE_BYTES);
    if (!fixture_open(&f, "local", 8, 2 * RANGE_BYTES, "")) {
        goto out;
    }
    memset(f.pool, 0, 8 * 2 * RANGE_BYTES);
    /* Regions: NULL, empty and impossible ones are refused, with *out_region 0. */
    CHECK_STATUS(kvt_tier_add_region(NULL, kmem, 16, &out), KVT_STATUS_NULL_ARGUMENT);
    CHECK(out == 0);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, NULL, 16, &out), KVT_STATUS_NULL_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, 16, NULL), KVT_STATUS_NULL_ARGUMENT);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, 0, &out), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, SIZE_MAX, &out), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_remove_region(NULL, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, 12345), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store_ranges(NULL, 1, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load_ranges(NULL, 1, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    if (!CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, RANGE_PAGES * RANGE_BYTES, &rk), KVT_STATUS_OK) ||
        !CHECK_STATUS(kvt_tier_add_region(f.tier, vmem, RANGE_PAGES * RANGE_BYTES, &rv), KVT_STATUS_OK)) {
        goto out;
    }
    CHECK(rk != 0 && rv != 0 && rk != rv);

    /* Pages 0..3 stored from ranges load into pool blocks and into pages 4..7. */
    for (p = 0; p < 4; p++) {
        page_ranges(ranges + 2 * p, rk, rv, p);
    }
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, job, ranges, 2, keys, KEY_LEN, 4), KVT_STATUS_OK);
    wait_ok(&f, &job, 1, scaled_ms(10000));
    job++;
    CHECK_STATUS(kvt_tier_submit_load(f.tier, job, ids, keys, KEY_LEN, 4), KVT_STATUS_OK);
    if (wait_ok(&f, &job, 1, scaled_ms(10000))) {
        for (p = 0; p < 4; p++) {
            CHECKF(memcmp(block(&f, p), kmem + p * RANGE_BYTES, RANGE_BYTES) == 0 &&
                       memcmp(block(&f, p) + RANGE_BYTES, vmem + p * RANGE_BYTES, RANGE_BYTES) == 0,
                   "page %zu loaded into a pool block", p);
        }
    }
    job++;
    for (p = 0; p < 4; p++) {
        page_ranges(ranges + 2 * p, rk, rv, 4 + p);
    }
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, job, ranges, 2, keys, KEY_LEN, 4), KVT_STATUS_OK);
    if (wait_ok(&f, &job, 1, scaled_ms(10000))) {
        CHECK(memcmp(kmem, kmem + 4 * RANGE_BYTES, 4 * RANGE_BYTES) == 0);
        CHECK(memcmp(vmem, vmem + 4 * RANGE_BYTES, 4 * RANGE_BYTES) == 0);
    }

    /* Bad arguments: the status, and the job's one result already queued. */
    for (i = 0; i < 2; i++) {
        struct {
            const char *what;
            kvt_range r0, r1;
            size_t per_key, num_keys;
            int null_ranges;
            kvt_status want;
        } cases[] = {
            {"NULL ranges", {0, 0, 0}, {0, 0, 0}, 2, 1, 1, KVT_STATUS_NULL_ARGUMENT},
            {"ranges_per_key 0", {rk, 0, 8}, {rv, 0, 8}, 0, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"ranges_per_key too large", {rk, 0, 8}, {rv, 0, 8}, KVT_MAX_RANGES_PER_KEY + 1, 1, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            /* The product is checked before the (2-element) array is read: ASan and
             * valgrind would see a read past it. */
            {"too many ranges", {rk, 0, 8}, {rv, 0, 8}, KVT_MAX_RANGES_PER_KEY, 4096, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            {"unknown region", {rk + rv + 100, 0, 8}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"zero length", {rk, 0, 0}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"past the region's end", {rk, RANGE_PAGES * RANGE_BYTES - 1, 2}, {rv, 0, 8}, 2, 1, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            {"huge offset", {rk, UINT64_MAX, 2}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"huge length", {rk, 8, UINT64_MAX}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
        };
        size_t c;
        for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            kvt_status got;
            job++;
            bad[0] = cases[c].r0;
            bad[1] = cases[c].r1;
            got = submit_ranges(&f, kinds[i], job, cases[c].null_ranges ? NULL : bad, cases[c].per_key, keys,
                                cases[c].num_keys);
            CHECKF(got == cases[c].want, "%s: returned %d (%s): %s", cases[c].what, (int)got, kvt_status_str(got),
                   kvt_last_error());
            memset(&r, 0, sizeof r);
            if (expect_one_queued(&f, job, &r)) {
                CHECKF(r.status == cases[c].want && r.kind == kinds[i], "%s: result %d", cases[c].what,
                       (int)r.status);
                CHECKF(r.num_keys == cases[c].num_keys || cases[c].num_keys > KVT_MAX_KEYS_PER_JOB,
                       "%s: %zu keys", cases[c].what, r.num_keys);
            }
            free_results(&r, 1);
        }
    }

    /* A load of bytes a store holds is busy, and two keys of one load may not share bytes;
     * the region cannot be removed while the store's result waits. */
    page_ranges(ranges, rk, rv, 0);
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, 100, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_OK);
    bad[0].region = rv;
    bad[0].offset = RANGE_BYTES - 1;
    bad[0].len = 2;
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 101, bad, 1, keys, KEY_LEN, 1), KVT_STATUS_BLOCK_BUSY);
    page_ranges(ranges + 2, rk, rv, 6);
    page_ranges(ranges + 4, rk, rv, 6);
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 102, ranges + 2, 2, keys, KEY_LEN, 2),
                 KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_BLOCK_BUSY);
    CHECK(strstr(kvt_last_error(), "poll") != NULL);
    CHECK(discard_results(&f) == 3);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 103, ranges, 2, keys, KEY_LEN, 1),
                 KVT_STATUS_INVALID_ARGUMENT);
    CHECK(discard_results(&f) == 1);

    /* After shutdown: no new region or job (its one result queued); removing works. */
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, vmem, 16, &out), KVT_STATUS_SHUT_DOWN);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, 104, ranges, 1, keys, KEY_LEN, 1), KVT_STATUS_SHUT_DOWN);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 104, &r)) {
        CHECK(r.status == KVT_STATUS_SHUT_DOWN);
    }
    free_results(&r, 1);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rk), KVT_STATUS_OK);
out:
    fixture_close(&f);
    free(keys);
    free(kmem);
    free(vmem);
}

/* ------------------------------------------------------------------------------------ */
/* Pages of many ranges through a second tier, on any store                             */
/* ------------------------------------------------------------------------------------ */

/* Pages of 2 ranges (K and V) and of 2 x 32 ranges (32 layers, K and V apart, one
 * allocation each) round-trip byte-exact through a second tier on the store of
 * KVT_HARNESS_STORE (ffi-tests/on_s3_servers.py runs this case on s3s-fs, moto and Ceph
 * RGW), else on a local store; a page stored from 64 ranges loads into a pool block as the
 * same object. */
enum { STORE_LAYERS = 32, STORE_PIECE = 2048, STORE_PAGES = 3 };

typedef struct {
    uint8_t *k[STORE_LAYERS], *v[STORE_LAYERS];
    uint64_t kr[STORE_LAYERS], vr[STORE_LAYERS];
} layer_pool;

static int layer_pool_open(layer_pool *lp, kvt_tier *tier, int random)
{
    int l, ok = 1;
    for (l = 0; l < STORE_LAYERS; l++) {
        lp->k[l] = (uint8_t *)xmalloc(STORE_PAGES * STORE_PIECE);
        lp->v[l] = (uint8_t *)xmalloc(STORE_PAGES * STORE_PIECE);
        if (random) {
            rng_fill(lp->k[l], STORE_PAGES * STORE_PIECE);
            rng_fill(lp->v[l], STORE_PAGES * STORE_PIECE);
        } else {
            memset(lp->k[l], 0, STORE_PAGES * STORE_PIECE);
            memset(lp->v[l], 0, STORE_PAGES * STORE_PIECE);
        }
        ok &= CHECK_STATUS(kvt_tier_add_region(tier, lp->k[l], STORE_PAGES * STORE_PIECE, &lp->kr[l]), KVT_STATUS_OK);
        ok &= CHECK_STATUS(kvt_tier_add_region(tier, lp->v[l], STORE_PAGES * STORE_PIECE, &lp->vr[l]), KVT_STATUS_OK);
    }
    return ok;
}

static void layer_pool_free(layer_pool *lp)
{
    int l;
    for (l = 0; l < STORE_LAYERS; l++) {
        free(lp->k[l]);
        free(lp->v[l]);
    }
}

/* The ranges of page p: K and V of layer 0 (layers = 1), or of every layer. */
static void layer_pool_page(const layer_pool *lp, size_t p, int layers, kvt_range *out)
{
    int l;
    for (l = 0; l < layers; l++) {
        out[2 * l].region = lp->kr[l];
        out[2 * l].offset = (uint64_t)p * STORE_PIECE;
        out[2 * l].len = STORE_PIECE;
        out[2 * l + 1].region = lp->vr[l];
        out[2 * l + 1].offset = (uint64_t)p * STORE_PIECE;
        out[2 * l + 1].len = STORE_PIECE;
    }
}

/* Page p of `a` equals page q of `b` over `layers` layers. */
static int layer_pool_same(const layer_pool *a, size_t p, const layer_pool *b, size_t q, int layers)
{
    int l, same = 1;
    for (l = 0; l < layers; l++) {
        same &= memcmp(a->k[l] + p * STORE_PIECE, b->k[l] + q * STORE_PIECE, STORE_PIECE) == 0;
        same &= memcmp(a->v[l] + p * STORE_PIECE, b->v[l] + q * STORE_PIECE, STORE_PIECE) == 0;
    }
    return same;
}

void test_ranges_on_store(void)
{
    fixture w, r;
    layer_pool src, dst;
    uint8_t *keys = make_keys(2 * STORE_PAGES); /* 2-range pages, then 64-range pages */
    kvt_range ranges[STORE_PAGES * 2 * STORE_LAYERS];
    uint64_t jobs[2] = {1, 2}, ids[STORE_PAGES];
    const char *where = getenv("KVT_HARNESS_STORE");
    char json[1200];
    size_t p;
    int l, layers[2] = {1, STORE_LAYERS};

    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    memset(&r, 0, sizeof r);
    printf("    store: %s\n", where && *where ? where : "local");
    /* The writer; the reader below opens the same store and prefix. */
    if (!fixture_open(&w, "env", STORE_PAGES, 2 * STORE_LAYERS * STORE_PIECE, "")) {
        goto out;
    }
    if (!layer_pool_open(&src, w.tier, 1)) {
        goto out;
    }
    for (l = 0; l < 2; l++) {
        for (p = 0; p < STORE_PAGES; p++) {
            layer_pool_page(&src, p, layers[l], ranges + p * 2 * layers[l]);
        }
        CHECK_STATUS(kvt_tier_submit_store_ranges(w.tier, jobs[l], ranges, 2 * (size_t)layers[l],
                                                  keys + l * STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                     KVT_STATUS_OK);
        w.block_bytes = 2 * (size_t)layers[l] * STORE_PIECE; /* the bytes of one key's object */
        if (!wait_ok(&w, &jobs[l], 1, scaled_ms(30000))) {
            goto out;
        }
    }

    /* The reader: the same store and prefix, its own memory. */
    if (w.dir[0]) {
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s/store\"}}", w.dir);
    } else {
        snprintf(json, sizeof json, "{\"store\":%s,\"prefix\":\"%s\"}", where, w.prefix);
    }
    if (!CHECK_STATUS(kvt_tier_new(json, &r.tier), KVT_STATUS_OK)) {
        goto out;
    }
    r.num_blocks = STORE_PAGES;
    r.block_bytes = 2 * STORE_LAYERS * STORE_PIECE;
    r.pool = (uint8_t *)xmalloc(STORE_PAGES * r.block_bytes);
    memset(r.pool, 0, STORE_PAGES * r.block_bytes);
    CHECK_STATUS(kvt_tier_register_memory(r.tier, r.pool, STORE_PAGES, r.block_bytes), KVT_STATUS_OK);
    if (!layer_pool_open(&dst, r.tier, 0)) {
        goto out;
    }
    /* Page p's keys load into page STORE_PAGES-1-p. */
    for (l = 0; l < 2; l++) {
        for (p = 0; p < STORE_PAGES; p++) {
            layer_pool_page(&dst, STORE_PAGES - 1 - p, layers[l], ranges + p * 2 * layers[l]);
        }
        CHECK_STATUS(kvt_tier_submit_load_ranges(r.tier, jobs[l], ranges, 2 * (size_t)layers[l],
                                                 keys + l * STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                     KVT_STATUS_OK);
        r.block_bytes = 2 * (size_t)layers[l] * STORE_PIECE;
        if (!wait_ok(&r, &jobs[l], 1, scaled_ms(30000))) {
            goto out;
        }
        for (p = 0; p < STORE_PAGES; p++) {
            CHECKF(layer_pool_same(&src, p, &dst, STORE_PAGES - 1 - p, layers[l]),
                   "page %zu of %d ranges differs after the round trip", p, 2 * layers[l]);
        }
    }
    /* The 64-range pages are the objects pool blocks of the same bytes give. */
    for (p = 0; p < STORE_PAGES; p++) {
        ids[p] = p;
    }
    jobs[0] = 3;
    r.block_bytes = 2 * STORE_LAYERS * STORE_PIECE;
    CHECK_STATUS(kvt_tier_submit_load(r.tier, 3, ids, keys + STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                 KVT_STATUS_OK);
    if (wait_ok(&r, jobs, 1, scaled_ms(30000))) {
        for (p = 0; p < STORE_PAGES; p++) {
            int same = 1;
            for (l = 0; l < STORE_LAYERS; l++) {
                const uint8_t *at = r.pool + p * r.block_bytes + (size_t)l * 2 * STORE_PIECE;
                same &= memcmp(at, src.k[l] + p * STORE_PIECE, STORE_PIECE) == 0;
                same &= memcmp(at + STORE_PIECE, src.v[l] + p * STORE_PIECE, STORE_PIECE) == 0;
            }
            CHECKF(same, "page %zu loaded into a block differs from its 64 ranges", p);
        }
    }
out:
    fixture_close(&r);
    fixture_close(&w);
    layer_pool_free(&src);
    layer_pool_free(&dst);
    free(keys);
}
