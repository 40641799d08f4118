/*
 * ffi-tests/harness/cases_random.c: random call sequences against a model.
 *
 * A property test of the whole job API: sequences of random submissions (good ones and
 * every kind of refusal: bad arguments, pending ids, held blocks), polls of random
 * capacity, lookups, scheduler steps, drains and counters on a small pool with guard
 * bytes around it. A model predicts each submission's status and each result, tracks
 * which job holds which block, and checks the pool after every poll: a block no load
 * holds keeps its bytes, a load brings back exactly what its key's store took. A failing
 * sequence prints the KVT_HARNESS_SEED that reproduces it.
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* The model                                                                            */
/* ------------------------------------------------------------------------------------ */

enum { SEQ_BLOCKS = 24, SEQ_BB = 512, SEQ_GUARD = 4096, SEQ_MAXK = 4, SEQ_KEYS = 512, SEQ_MAXJOBS = 1024 };

typedef struct seq_key {
    uint8_t key[KEY_LEN];
    int state;              /* 0 unused, 1 store pending, 2 stored (content below), 3 never stored */
    uint8_t content[SEQ_BB];
} seq_key;

typedef struct seq_job {
    uint64_t id;
    int load;
    kvt_status want;        /* the submit's status */
    int accepted;           /* holds its blocks until its result is polled */
    size_t nkeys;
    uint64_t blocks[SEQ_MAXK];
    int keys[SEQ_MAXK];     /* indices into the key table, -1 for none */
    int results;
} seq_job;

typedef struct seq_model {
    seq_key *keys;
    size_t nkeys;
    seq_job *jobs;
    size_t njobs;
    int readers[SEQ_BLOCKS], writer[SEQ_BLOCKS];
    int known[SEQ_BLOCKS];              /* expected[] holds the block's bytes */
    uint8_t expected[SEQ_BLOCKS][SEQ_BB];
    uint8_t *mem, *pool;                /* mem = guard + pool + guard */
    size_t bad;
    size_t stores, loads, busy, rejected, duplicates, loaded_keys_checked, absent_keys;
} seq_model;

static int seq_fresh_key(seq_model *m, int state)
{
    int k;
    if (m->nkeys >= SEQ_KEYS) {
        return -1;
    }
    k = (int)m->nkeys++;
    make_key(m->keys[k].key, (uint32_t)(k % 4));
    m->keys[k].state = state;
    return k;
}

static seq_job *seq_find(seq_model *m, uint64_t id)
{
    size_t i;
    for (i = 0; i < m->njobs; i++) {
        if (m->jobs[i].id == id && m->jobs[i].want != KVT_STATUS_DUPLICATE_JOB) {
            return &m->jobs[i];
        }
    }
    return NULL;
}

/* Checks one result against the model and releases the job's blocks. */
static void seq_result(seq_model *m, const kvt_result *r)
{
    seq_job *j = seq_find(m, r->job_id);
    size_t i;
    check_result_invariants(r, SEQ_BB);
    if (!CHECKF(j != NULL, "result for unknown job %" PRIu64, r->job_id)) {
        m->bad++;
        return;
    }
    if (!CHECKF(j->results++ == 0, "job %" PRIu64 " reported twice", j->id)) {
        m->bad++;
        return;
    }
    if (!j->accepted) {
        m->bad += !CHECKF(r->status == j->want, "job %" PRIu64 ": rejected with %d, result %d", j->id, (int)j->want,
                          (int)r->status);
        return;
    }
    m->bad += !CHECKF(r->num_keys == j->nkeys, "job %" PRIu64 ": %zu keys", j->id, r->num_keys);
    for (i = 0; i < j->nkeys && i < r->num_keys; i++) {
        uint64_t b = j->blocks[i];
        seq_key *k = &m->keys[j->keys[i]];
        if (!j->load) {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_OK, "store %" PRIu64 " key %zu: %d", j->id, i,
                              (int)r->key_status[i]);
            k->state = r->key_status[i] == KVT_STATUS_OK ? 2 : 3;
        } else if (k->state == 2) {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_OK, "load %" PRIu64 " key %zu: %d", j->id, i,
                              (int)r->key_status[i]);
            m->bad += !CHECKF(memcmp(m->pool + b * SEQ_BB, k->content, SEQ_BB) == 0,
                              "load %" PRIu64 ": block %" PRIu64 " does not hold key %d's bytes", j->id, b, j->keys[i]);
            memcpy(m->expected[b], k->content, SEQ_BB);
            m->known[b] = 1;
            m->loaded_keys_checked++;
        } else {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_NOT_FOUND, "load %" PRIu64 " of an absent key: %d",
                              j->id, (int)r->key_status[i]);
            m->known[b] = 0; /* a failed key's block content is unspecified */
            m->absent_keys++;
        }
    }
    /* Release the holds (stores may name a block twice: count each block once). */
    for (i = 0; i < j->nkeys; i++) {
        size_t e;
        int first = 1;
        for (e = 0; e < i; e++) {
            first &= j->blocks[e] != j->blocks[i];
        }
        if (!first) {
            continue;
        }
        if (j->load) {
            m->writer[j->blocks[i]] = 0;
        } else {
            m->readers[j->blocks[i]]--;
        }
    }
}

/* Blocks no load holds have their expected bytes; the guards are intact. */
static void seq_check_memory(seq_model *m)
{
    size_t b, i;
    for (b = 0; b < SEQ_BLOCKS; b++) {
        if (!m->writer[b] && m->known[b]) {
            m->bad += !CHECKF(memcmp(m->pool + b * SEQ_BB, m->expected[b], SEQ_BB) == 0,
                              "block %zu changed although no load held it", b);
        }
    }
    for (i = 0; i < SEQ_GUARD; i++) {
        if (m->mem[i] != 0xa5 || m->mem[SEQ_GUARD + SEQ_BLOCKS * SEQ_BB + i] != 0x5a) {
            m->bad += !CHECKF(0, "guard byte %zu around the pool changed", i);
            break;
        }
    }
}

/* Polls once with `capacity` and checks what came against the model. */
static void seq_poll(seq_model *m, kvt_tier *t, size_t capacity)
{
    kvt_result buf[8];
    size_t n = 99, i;
    m->bad += !CHECK_STATUS(kvt_tier_poll(t, capacity ? buf : NULL, capacity, &n), KVT_STATUS_OK);
    m->bad += !CHECK(n <= capacity);
    for (i = 0; i < n && i < capacity; i++) {
        seq_result(m, &buf[i]);
    }
    seq_check_memory(m);
}

/* Submits one random job, well-formed or of a random refusal, with the status the model
 * predicts for it, and records what it holds. */
static void seq_submit(seq_model *m, kvt_tier *t, uint64_t *next_id)
{
    seq_job *j = &m->jobs[m->njobs];
    uint8_t keybuf[SEQ_MAXK * KEY_LEN];
    uint64_t blocks[SEQ_MAXK];
    size_t i, key_len = KEY_LEN, n;
    const uint8_t *keys = keybuf;
    const uint64_t *ids = blocks;
    int variant = (int)(rng_next() % 32);
    kvt_status got;

    memset(j, 0, sizeof *j);
    j->load = (int)(rng_next() % 2);
    j->nkeys = n = 1 + (size_t)(rng_next() % SEQ_MAXK);
    j->id = (*next_id)++;
    j->want = KVT_STATUS_OK;
    for (i = 0; i < n; i++) {
        j->keys[i] = -1;
    }
    if (variant == 0 && m->njobs > 0) { /* an id whose result is pending */
        size_t back = (size_t)(rng_next() % m->njobs);
        seq_job *old = &m->jobs[back];
        if (old->want != KVT_STATUS_DUPLICATE_JOB && old->results == 0) {
            j->id = old->id;
            (*next_id)--;
            j->want = KVT_STATUS_DUPLICATE_JOB;
        }
    }
    for (i = 0; i < n; i++) {
        int k;
        blocks[i] = rng_next() % SEQ_BLOCKS;
        if (j->load) {
            /* mostly a stored key, else one never stored */
            size_t tries;
            int want_state = rng_next() % 4 == 0 ? 3 : 2;
            k = -1;
            for (tries = 0; tries < 32 && m->nkeys > 0; tries++) {
                int c = (int)(rng_next() % m->nkeys);
                if (m->keys[c].state == want_state) {
                    k = c;
                    break;
                }
            }
            if (k < 0) {
                k = seq_fresh_key(m, 3);
            }
        } else {
            k = j->want == KVT_STATUS_DUPLICATE_JOB ? -1 : seq_fresh_key(m, 1);
        }
        if (k < 0) {
            make_key(keybuf + i * KEY_LEN, 0);
        } else {
            memcpy(keybuf + i * KEY_LEN, m->keys[k].key, KEY_LEN);
        }
        j->keys[i] = k;
    }
    if (j->load) { /* distinct blocks, unless the variant below wants a repeat */
        for (i = 0; i < n; i++) {
            blocks[i] = (blocks[0] + i * 5) % SEQ_BLOCKS;
        }
    }
    memcpy(j->blocks, blocks, sizeof blocks);
    if (j->want != KVT_STATUS_DUPLICATE_JOB) {
        switch (variant) {
        case 1: keys = NULL; j->want = KVT_STATUS_NULL_ARGUMENT; break;
        case 2: ids = NULL; j->want = KVT_STATUS_NULL_ARGUMENT; break;
        case 3: key_len = KEY_LEN - 1; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 4: key_len = SIZE_MAX - (size_t)(rng_next() % 64); j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 5: blocks[n - 1] = SEQ_BLOCKS + rng_next() % 3; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 6: n = 0; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 7:
            if (j->load && n > 1) {
                blocks[1] = blocks[0];
                j->want = KVT_STATUS_INVALID_ARGUMENT;
            }
            break;
        default: break;
        }
    }
    if (j->want == KVT_STATUS_OK) { /* holds: a load needs its blocks alone */
        for (i = 0; i < n; i++) {
            uint64_t b = blocks[i];
            if (m->writer[b] || (j->load && m->readers[b] > 0)) {
                j->want = KVT_STATUS_BLOCK_BUSY;
            }
        }
    }
    if (j->want != KVT_STATUS_OK && j->want != KVT_STATUS_DUPLICATE_JOB) {
        for (i = 0; i < j->nkeys; i++) { /* the job's fresh keys are never stored */
            if (j->keys[i] >= 0 && m->keys[j->keys[i]].state == 1) {
                m->keys[j->keys[i]].state = 3;
            }
        }
    }
    got = submit_kind(t, j->load ? KVT_JOB_KIND_LOAD : KVT_JOB_KIND_STORE, j->id, ids, keys, key_len, n);
    m->bad += !CHECKF(got == j->want, "job %" PRIu64 " (%s, %zu keys, variant %d): returned %d (%s), want %d (%s): %s",
                      j->id, j->load ? "load" : "store", n, variant, (int)got, kvt_status_str(got), (int)j->want,
                      kvt_status_str(j->want), kvt_last_error());
    if (got != j->want) {
        j->want = got; /* follow the library, to keep checking the rest */
    }
    j->nkeys = n;
    j->accepted = j->want == KVT_STATUS_OK;
    m->stores += j->accepted && !j->load;
    m->loads += j->accepted && j->load;
    m->busy += j->want == KVT_STATUS_BLOCK_BUSY;
    m->duplicates += j->want == KVT_STATUS_DUPLICATE_JOB;
    m->rejected += !j->accepted && j->want != KVT_STATUS_BLOCK_BUSY && j->want != KVT_STATUS_DUPLICATE_JOB;
    if (j->accepted) {
        for (i = 0; i < n; i++) {
            uint64_t b = blocks[i];
            size_t e;
            int first = 1;
            for (e = 0; e < i; e++) {
                first &= blocks[e] != b;
            }
            if (j->load) {
                m->writer[b] = 1;
            } else {
                /* the key's bytes are the block's now: no load may write it meanwhile */
                memcpy(m->keys[j->keys[i]].content, m->pool + b * SEQ_BB, SEQ_BB);
                if (first) {
                    m->readers[b]++;
                }
            }
        }
    }
    m->njobs++;
}

/* ------------------------------------------------------------------------------------ */
/* The sequences                                                                        */
/* ------------------------------------------------------------------------------------ */

void test_random_sequences(void)
{
    const int sequences = g_small ? 4 : 24, steps = g_small ? 80 : 250;
    int seq;
    seq_model m;

    memset(&m, 0, sizeof m);
    m.keys = (seq_key *)xmalloc(SEQ_KEYS * sizeof(seq_key));
    m.jobs = (seq_job *)xmalloc(SEQ_MAXJOBS * sizeof(seq_job));
    m.mem = (uint8_t *)xmalloc(2 * SEQ_GUARD + SEQ_BLOCKS * SEQ_BB);
    for (seq = 0; seq < sequences && m.bad == 0; seq++) {
        kvt_tier *t = NULL;
        uint64_t next_id = 1;
        int step;
        size_t i, lost = 0;
        m.nkeys = m.njobs = 0;
        memset(m.readers, 0, sizeof m.readers);
        memset(m.writer, 0, sizeof m.writer);
        memset(m.mem, 0xa5, SEQ_GUARD);
        memset(m.mem + SEQ_GUARD + SEQ_BLOCKS * SEQ_BB, 0x5a, SEQ_GUARD);
        m.pool = m.mem + SEQ_GUARD;
        rng_fill(m.pool, SEQ_BLOCKS * SEQ_BB);
        for (i = 0; i < SEQ_BLOCKS; i++) {
            memcpy(m.expected[i], m.pool + i * SEQ_BB, SEQ_BB);
            m.known[i] = 1;
        }
        if (!CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"max_inflight_transfers\":3}", &t),
                          KVT_STATUS_OK)) {
            break;
        }
        CHECK_STATUS(kvt_tier_register_memory(t, m.pool, SEQ_BLOCKS, SEQ_BB), KVT_STATUS_OK);
        for (step = 0; step < steps && m.njobs < SEQ_MAXJOBS && m.nkeys + SEQ_MAXK < SEQ_KEYS; step++) {
            int op = (int)(rng_next() % 10);
            if (op < 4) {
                seq_submit(&m, t, &next_id);
            } else if (op < 8) {
                seq_poll(&m, t, (size_t)(rng_next() % 6));
            } else if (op == 8) {
                kvt_lookup_result verdict;
                int k = m.nkeys ? (int)(rng_next() % m.nkeys) : -1;
                if (k >= 0) {
                    m.bad += !CHECK_STATUS(kvt_tier_lookup(t, rng_next() % 4, m.keys[k].key, KEY_LEN, &verdict),
                                           KVT_STATUS_OK);
                }
                m.bad += !CHECK_STATUS(kvt_tier_schedule_end(t), KVT_STATUS_OK);
                if (rng_next() % 3 == 0) {
                    m.bad += !CHECK_STATUS(kvt_tier_request_finished(t, rng_next() % 4), KVT_STATUS_OK);
                }
            } else {
                kvt_status d = kvt_tier_drain(t, 0);
                kvt_stats stats;
                m.bad += !CHECKF(d == KVT_STATUS_OK || d == KVT_STATUS_TIMEOUT, "drain(0): %d", (int)d);
                m.bad += !CHECK_STATUS(kvt_tier_stats(t, &stats, sizeof stats), KVT_STATUS_OK);
            }
        }
        m.bad += !CHECK_STATUS(kvt_tier_drain(t, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
        seq_poll(&m, t, 8);
        for (i = 0; i < 2 * SEQ_MAXJOBS; i++) {
            size_t before = 0, j;
            for (j = 0; j < m.njobs; j++) {
                before += (size_t)m.jobs[j].results;
            }
            seq_poll(&m, t, 8);
            for (j = 0; j < m.njobs; j++) {
                before -= (size_t)m.jobs[j].results;
            }
            if (before == 0) {
                break; /* nothing more came */
            }
        }
        for (i = 0; i < m.njobs; i++) {
            const seq_job *j = &m.jobs[i];
            if (j->want == KVT_STATUS_DUPLICATE_JOB) {
                continue;
            }
            lost += j->results != 1;
        }
        m.bad += !CHECKF(lost == 0, "sequence %d: %zu jobs without exactly one result", seq, lost);
        kvt_tier_free(t);
        seq_check_memory(&m);
    }
    printf("    %d sequences: %zu stores, %zu loads (%zu keys checked byte for byte, %zu absent), %zu BLOCK_BUSY,"
           " %zu other rejections, %zu duplicate ids\n",
           seq, m.stores, m.loads, m.loaded_keys_checked, m.absent_keys, m.busy, m.rejected, m.duplicates);
    if (m.bad > 0) {
        printf("    (KVT_HARNESS_SEED=%" PRIu64 " reproduces the failing sequence)\n", g_seed);
    }
    free(m.mem);
    free(m.jobs);
    free(m.keys);
}
