// ffi-tests/dlopen_test.cpp: kvtier.hpp end to end, with the library loaded at run time.
//
//   dlopen_test /path/to/libkvtier.so      dlopen (RTLD_NOW | RTLD_LOCAL) via
//                                          kvtier::Api::load; not linked with libkvtier
//
// Built with -DKVTIER_HPP_TEST_LINKED (and -lkvtier) the same tests run against
// kvtier::Api::linked() instead, and the argument is not needed.
//
// Prints "N passed, M failed" last; exits non-zero on any failure.
#ifndef KVTIER_HPP_TEST_LINKED
#define KVTIER_HPP_NO_LINKED_API // prove that nothing here references kvt_ symbols directly
#endif
#include "kvtier.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ftw.h>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

int g_failed_checks = 0;

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            std::printf("    FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                      \
            ++g_failed_checks;                                                                   \
        }                                                                                        \
    } while (0)

// Runs `body`, expecting it to throw kvtier::Error with `status`; returns the message.
std::string expect_error(kvt_status status, const std::function<void()> &body, const char *what,
                         bool submitted = true)
{
    try {
        body();
    } catch (const kvtier::Error &e) {
        if (e.status() != status || e.submitted() != submitted) {
            std::printf("    FAIL %s: Error status %d submitted %d (%s), want %d submitted %d\n", what,
                        static_cast<int>(e.status()), e.submitted(), e.what(), static_cast<int>(status),
                        submitted);
            ++g_failed_checks;
        }
        return e.what();
    } catch (const std::exception &e) {
        std::printf("    FAIL %s: unexpected exception %s\n", what, e.what());
        ++g_failed_checks;
        return "";
    }
    std::printf("    FAIL %s: no exception, want status %d\n", what, static_cast<int>(status));
    ++g_failed_checks;
    return "";
}

struct TempDir {
    std::string path;
    TempDir()
    {
        const char *base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvtier-hpp-XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        if (::mkdtemp(buf.data()) == nullptr) {
            throw std::runtime_error("mkdtemp failed");
        }
        path = buf.data();
    }
    ~TempDir()
    {
        ::nftw(
            path.c_str(),
            [](const char *p, const struct stat *, int type, struct FTW *) {
                return type == FTW_DP ? ::rmdir(p) : ::unlink(p);
            },
            16, FTW_DEPTH | FTW_PHYS);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
};

std::string local_config(const TempDir &dir) { return R"({"store":{"type":"local","path":")" + dir.path + R"(/s"}})"; }

// Polls (sleeping on the event fd) until `want` results arrived or 10 s passed.
std::vector<kvtier::Result> wait_results(kvtier::Tier &tier, std::size_t want)
{
    std::vector<kvtier::Result> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < want && std::chrono::steady_clock::now() < deadline) {
        pollfd p{tier.event_fd(), POLLIN, 0};
        ::poll(&p, 1, 100);
        tier.poll_into(out, 3);
    }
    return out;
}

std::vector<std::uint8_t> make_keys(std::mt19937_64 &rng, std::size_t n)
{
    std::vector<std::uint8_t> keys(n * KVT_DEFAULT_KEY_BYTES);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t b = 0; b < KVT_DEFAULT_KEY_BYTES - KVT_KEY_GROUP_BYTES; ++b) {
            keys[i * KVT_DEFAULT_KEY_BYTES + b] = static_cast<std::uint8_t>(rng());
        }
        // group index, 4 bytes big-endian: 0 0 0 1
        keys[i * KVT_DEFAULT_KEY_BYTES + KVT_DEFAULT_KEY_BYTES - 1] = 1;
    }
    return keys;
}

void test_loader_errors(const char *)
{
    std::string m = expect_error(KVT_STATUS_NOT_FOUND, [] { kvtier::Api::load("/nonexistent/libkvtier.so"); },
                                 "load of a missing file");
    CHECK(m.find("/nonexistent/libkvtier.so") != std::string::npos);
    // A real library without the kvt_ symbols: the missing symbol is named.
    m = expect_error(KVT_STATUS_NOT_FOUND, [] { kvtier::Api::load("libm.so.6"); }, "load of libm");
    CHECK(m.find("kvt_version") != std::string::npos);
    kvtier::Api empty;
    CHECK(!empty.complete());
    expect_error(KVT_STATUS_NULL_ARGUMENT, [&] { kvtier::Tier t(empty, R"({"store":{"type":"memory"}})"); },
                 "Tier from an empty Api");
}

void test_version(const kvtier::Api &api)
{
    CHECK(api.complete());
    CHECK(std::strcmp(api.version(), KVTIER_VERSION) == 0);
    CHECK(kvtier::version(api) == KVTIER_VERSION);
    api.check_version(); // does not throw
    CHECK(std::strcmp(api.status_str(KVT_STATUS_NOT_FOUND), "not found") == 0);
#ifdef KVTIER_HPP_TEST_LINKED
    CHECK(&api == &kvtier::Api::linked());
    CHECK(kvtier::version() == KVTIER_VERSION);
#else
    // RTLD_LOCAL: the library's symbols are not globally visible.
    CHECK(::dlsym(RTLD_DEFAULT, "kvt_version") == nullptr);
    CHECK(api.handle != nullptr);
#endif
}

void test_config_error(const kvtier::Api &api)
{
    std::string m = expect_error(
        KVT_STATUS_CONFIG, [&] { kvtier::Tier t(api, R"({"store":{"type":"memory"},"colour":"blue"})"); },
        "unknown config key");
    CHECK(m.find("colour") != std::string::npos);
    CHECK(m.find("kvt_tier_new") != std::string::npos);
    expect_error(KVT_STATUS_CONFIG, [&] { kvtier::Tier t(api, "{"); }, "malformed JSON");
}

void test_round_trip(const kvtier::Api &api)
{
    constexpr std::size_t kBlocks = 16, kHalf = 8, kBlockBytes = 32 * 1024;
    TempDir dir;
    std::mt19937_64 rng(42);
    std::vector<std::uint8_t> pool(kBlocks * kBlockBytes);
    for (auto &b : pool) {
        b = static_cast<std::uint8_t>(rng());
    }
    const std::vector<std::uint8_t> original(pool.begin(), pool.begin() + kHalf * kBlockBytes);
    const std::vector<std::uint8_t> keys = make_keys(rng, kHalf);

    kvtier::Tier tier(api, local_config(dir));
    CHECK(static_cast<bool>(tier));
    tier.register_memory(pool.data(), kBlocks, kBlockBytes);

    // Store blocks 0..7 under keys 0..7 in two jobs (vector and pointer+count spans).
    std::vector<std::uint64_t> ids{0, 1, 2, 3};
    tier.submit_store(1, ids, kvtier::Span<std::uint8_t>(keys.data(), 4 * KVT_DEFAULT_KEY_BYTES));
    const std::uint64_t ids2[] = {4, 5, 6, 7};
    tier.submit_store(2, ids2, kvtier::Span<std::uint8_t>(keys.data() + 4 * KVT_DEFAULT_KEY_BYTES,
                                                          4 * KVT_DEFAULT_KEY_BYTES));
    auto stored = wait_results(tier, 2);
    CHECK(stored.size() == 2);
    for (const auto &r : stored) {
        CHECK(r.ok());
        CHECK(r.kind == KVT_JOB_KIND_STORE);
        CHECK(r.key_status.size() == 4);
        CHECK(r.bytes == 4 * kBlockBytes);
        CHECK(r.message.empty());
    }
    std::fill(pool.begin(), pool.begin() + kHalf * kBlockBytes, 0xEE); // the blocks are ours again

    // Load key perm[i] into slot 8 + i.
    std::vector<std::uint64_t> perm(kHalf);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::rotate(perm.begin(), perm.begin() + 1, perm.end()); // never the identity
    std::vector<std::uint64_t> slots;
    std::vector<std::uint8_t> load_keys;
    for (std::size_t i = 0; i < kHalf; ++i) {
        slots.push_back(kHalf + i);
        load_keys.insert(load_keys.end(), keys.begin() + perm[i] * KVT_DEFAULT_KEY_BYTES,
                         keys.begin() + (perm[i] + 1) * KVT_DEFAULT_KEY_BYTES);
    }
    tier.submit_load(3, slots, load_keys);
    auto loaded = wait_results(tier, 1);
    CHECK(loaded.size() == 1);
    if (loaded.size() == 1) {
        CHECK(loaded[0].job_id == 3);
        CHECK(loaded[0].ok());
        CHECK(loaded[0].num_failed_keys == 0);
        CHECK(loaded[0].bytes == kHalf * kBlockBytes);
    }
    std::size_t bad = 0;
    for (std::size_t i = 0; i < kHalf; ++i) {
        bad += std::memcmp(pool.data() + (kHalf + i) * kBlockBytes, original.data() + perm[i] * kBlockBytes,
                           kBlockBytes) != 0;
    }
    CHECK(bad == 0);
    CHECK(tier.drain(std::chrono::seconds(5)));
    CHECK(tier.jobs_in_flight() == 0);
}

void test_errors_and_results(const kvtier::Api &api)
{
    TempDir dir;
    std::mt19937_64 rng(7);
    std::vector<std::uint8_t> pool(4 * 4096);
    auto keys = make_keys(rng, 2);
    kvtier::Tier tier(api, local_config(dir));

    // Before registration: throws STATE, and the job still yields its result.
    const std::uint64_t two[] = {0, 1};
    expect_error(KVT_STATUS_STATE, [&] { tier.submit_store(10, two, keys); }, "submit before register");
    tier.register_memory(pool.data(), 4, 4096);
    expect_error(KVT_STATUS_STATE, [&] { tier.register_memory(pool.data(), 4, 4096); }, "register twice");
    // Out of range: throws INVALID_ARGUMENT, result follows.
    const std::uint64_t bad_ids[] = {0, 4};
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.submit_load(11, bad_ids, keys); }, "block out of range");
    // Wrapper-side check: the key buffer does not match; nothing submitted, no result.
    expect_error(
        KVT_STATUS_INVALID_ARGUMENT,
        [&] { tier.submit_store(12, two, kvtier::Span<std::uint8_t>(keys.data(), KVT_DEFAULT_KEY_BYTES)); },
        "short key buffer", false);
    CHECK(tier.try_submit_store(13, two, keys, KVT_DEFAULT_KEY_BYTES + 1) == KVT_STATUS_INVALID_ARGUMENT);
    // Duplicate of a pending id.
    tier.submit_store(14, two, keys);
    expect_error(KVT_STATUS_DUPLICATE_JOB, [&] { tier.submit_store(14, two, keys); }, "duplicate job");
    CHECK(tier.try_submit_store(14, two, keys) == KVT_STATUS_DUPLICATE_JOB);

    auto results = wait_results(tier, 3);
    CHECK(results.size() == 3);
    std::sort(results.begin(), results.end(),
              [](const kvtier::Result &a, const kvtier::Result &b) { return a.job_id < b.job_id; });
    if (results.size() == 3) {
        CHECK(results[0].job_id == 10 && results[0].status == KVT_STATUS_STATE);
        CHECK(results[0].key_status.size() == 2 && results[0].num_failed_keys == 2);
        CHECK(!results[0].message.empty());
        CHECK(results[1].job_id == 11 && results[1].status == KVT_STATUS_INVALID_ARGUMENT);
        CHECK(results[1].kind == KVT_JOB_KIND_LOAD);
        CHECK(results[2].job_id == 14 && results[2].ok());
    }
    CHECK(tier.poll().empty());

    // Move construction and assignment keep exactly one owner.
    kvtier::Tier moved(std::move(tier));
    CHECK(!tier);
    CHECK(static_cast<bool>(moved));
    CHECK(moved.jobs_in_flight() == 0);
    kvtier::Tier other(api, R"({"store":{"type":"memory"}})");
    other = std::move(moved); // frees other's tier, takes moved's
    CHECK(!moved);
    CHECK(other.drain(std::chrono::milliseconds(100)));

    // After shutdown: submissions throw SHUT_DOWN and still report; poll works.
    other.shutdown();
    other.shutdown(); // idempotent
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { other.submit_store(20, two, keys); }, "submit after shutdown");
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { other.drain(std::chrono::milliseconds(0)); }, "drain after shutdown");
    auto last = other.poll();
    CHECK(last.size() == 1 && last[0].job_id == 20 && last[0].status == KVT_STATUS_SHUT_DOWN);
    other.reset();
    CHECK(!other);
    other.reset(); // no-op
}

// Stores keys, polls the result; returns false (after a failed CHECK) when it did not succeed.
bool store_and_wait(kvtier::Tier &tier, std::uint64_t job_id, const std::vector<std::uint64_t> &ids,
                    const std::vector<std::uint8_t> &keys)
{
    tier.submit_store(job_id, ids, keys);
    auto r = wait_results(tier, 1);
    CHECK(r.size() == 1 && r[0].job_id == job_id && r[0].ok());
    return r.size() == 1 && r[0].ok();
}

// Lookups (RETRY until a step ended, then HIT / MISS), BlockStored events copied out,
// counters, metrics text and location.
void test_lookups_events_stats(const kvtier::Api &api)
{
    constexpr std::size_t kBlockBytes = 4096;
    TempDir dir;
    std::mt19937_64 rng(11);
    std::vector<std::uint8_t> pool(4 * kBlockBytes, 0x5A);
    const auto keys = make_keys(rng, 3); // 0 and 1 stored, 2 absent
    const std::string config = R"({"store":{"type":"local","path":")" + dir.path +
                               R"(/s"},"enable_kv_events":true,"locality":"REMOTE"})";
    kvtier::Tier tier(api, config);
    tier.register_memory(pool.data(), 4, kBlockBytes);

    CHECK(tier.location().find(dir.path) != std::string::npos);
    CHECK(tier.take_events().empty()); // nothing stored yet
    const std::vector<std::uint8_t> two_keys(keys.begin(), keys.begin() + 2 * KVT_DEFAULT_KEY_BYTES);
    store_and_wait(tier, 1, {0, 1}, two_keys);

    // Events: one BlockStored for the job, keys in job order; copies survive the next call.
    auto events = tier.take_events(4);
    CHECK(events.size() == 1);
    CHECK(tier.take_events(4).empty()); // invalidates the library's buffers, not our copies
    if (events.size() == 1) {
        const kvtier::Event &e = events[0];
        CHECK(e.job_id == 1);
        CHECK(!e.removed);
        CHECK(e.key_len == KVT_DEFAULT_KEY_BYTES);
        CHECK(e.num_keys() == 2);
        CHECK(e.keys == two_keys);
        CHECK(e.medium == "STORAGE");
        CHECK(e.locality == KVT_LOCALITY_REMOTE);
        CHECK(e.num_keys() == 2 &&
              std::memcmp(e.key(1).data(), keys.data() + KVT_DEFAULT_KEY_BYTES, KVT_DEFAULT_KEY_BYTES) == 0);
    }

    // Lookups: a wrong key length is refused; an unknown key starts as RETRY.
    expect_error(KVT_STATUS_INVALID_ARGUMENT,
                 [&] { tier.lookup(7, kvtier::Span<std::uint8_t>(keys.data(), KVT_DEFAULT_KEY_BYTES - 1)); },
                 "lookup with a short key");
    const kvtier::Span<std::uint8_t> stored_key(keys.data() + KVT_DEFAULT_KEY_BYTES, KVT_DEFAULT_KEY_BYTES);
    const kvtier::Span<std::uint8_t> absent_key(keys.data() + 2 * KVT_DEFAULT_KEY_BYTES, KVT_DEFAULT_KEY_BYTES);
    kvt_lookup_result miss = tier.lookup(7, absent_key);
    CHECK(miss == KVT_LOOKUP_RESULT_RETRY);
    kvt_lookup_result hit = tier.lookup(7, stored_key);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((hit == KVT_LOOKUP_RESULT_RETRY || miss == KVT_LOOKUP_RESULT_RETRY) &&
           std::chrono::steady_clock::now() < deadline) {
        tier.schedule_end();
        ::usleep(1000);
        hit = tier.lookup(7, stored_key);
        miss = tier.lookup(7, absent_key);
    }
    CHECK(hit == KVT_LOOKUP_RESULT_HIT);
    CHECK(miss == KVT_LOOKUP_RESULT_MISS);
    // The same verdicts asked in one batch; a batch whose ids and keys disagree is refused.
    const std::uint64_t reqs[] = {7, 7};
    const auto both = tier.lookup_batch(reqs, kvtier::Span<std::uint8_t>(keys.data() + KVT_DEFAULT_KEY_BYTES,
                                                                          2 * KVT_DEFAULT_KEY_BYTES));
    CHECK(both.size() == 2 && both[0] == KVT_LOOKUP_RESULT_HIT && both[1] == KVT_LOOKUP_RESULT_MISS);
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.lookup_batch(reqs, stored_key); },
                 "lookup_batch with fewer keys than request ids", false);
    tier.request_finished(7);
    tier.request_finished(12345); // unknown: ignored

    // Load one key back, then check the counters and the metrics text.
    const std::uint64_t slot[] = {3};
    tier.submit_load(2, slot, stored_key);
    auto loaded = wait_results(tier, 1);
    CHECK(loaded.size() == 1 && loaded[0].ok());
    CHECK(tier.take_events().empty()); // loads yield no event
    const kvtier::Stats st = tier.stats();
    CHECK(st.keys_stored == 2);
    CHECK(st.bytes_stored == 2 * kBlockBytes);
    CHECK(st.keys_loaded == 1);
    CHECK(st.bytes_loaded == kBlockBytes);
    CHECK(st.keys_failed == 0);
    CHECK(st.existence_checks >= 1);
    const std::string metrics = tier.metrics();
    CHECK(metrics.find("\nkvtier_keys_stored_total 2\n") != std::string::npos);
    CHECK(metrics.find("\nkvtier_keys_loaded_total 1\n") != std::string::npos);
    CHECK(metrics.find("# TYPE kvtier_job_seconds histogram\n") != std::string::npos);
    CHECK(metrics.size() == std::strlen(metrics.c_str())); // no NUL inside

    // After shutdown: stats, metrics, location and events still work; lookups refuse.
    tier.shutdown();
    CHECK(tier.stats().keys_stored == 2);
    CHECK(tier.metrics().find("kvtier_keys_stored_total 2") != std::string::npos);
    CHECK(tier.location().find(dir.path) != std::string::npos);
    CHECK(tier.take_events().empty());
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { tier.lookup(8, stored_key); }, "lookup after shutdown");
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { tier.schedule_end(); }, "schedule_end after shutdown");
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { tier.request_finished(8); }, "request_finished after shutdown");
}

// evict_now on a tier with a byte budget; the BlockRemoved events via take_kv_events.
void test_eviction(const kvtier::Api &api)
{
    constexpr std::size_t kBlockBytes = 4096;
    TempDir dir;
    std::mt19937_64 rng(13);
    std::vector<std::uint8_t> pool(4 * kBlockBytes, 0x33);
    const auto keys = make_keys(rng, 4);
    const std::string config = R"({"store":{"type":"local","path":")" + dir.path +
                               R"(/s"},"namespace":"m_0123456789ab_r0","enable_kv_events":true,)"
                               R"("eviction":{"max_bytes":)" +
                               std::to_string(2 * kBlockBytes) + R"(,"interval_ms":3600000}})";
    kvtier::config_check(api, config); // does not throw
    kvtier::Tier tier(api, config);
    tier.register_memory(pool.data(), 4, kBlockBytes);
    CHECK(tier.location().find("m_0123456789ab_r0") != std::string::npos);
    store_and_wait(tier, 1, {0, 1, 2, 3}, keys);
    const kvtier::EvictionReport rep = tier.evict_now();
    CHECK(rep.objects == 4);
    CHECK(rep.bytes == 4 * kBlockBytes);
    CHECK(rep.deleted == 2);
    CHECK(rep.deleted_bytes == 2 * kBlockBytes);
    CHECK(tier.stats().evicted_blocks == 2);
    CHECK(tier.stats().evicted_bytes == 2 * kBlockBytes);

    auto events = tier.take_kv_events(16);
    std::size_t stored = 0, removed = 0;
    for (const auto &e : events) {
        if (e.removed) {
            CHECK(e.job_id == 0);
            for (std::size_t i = 0; i < e.num_keys(); ++i) {
                ++removed;
                bool known = false;
                for (std::size_t k = 0; k < 4; ++k) {
                    known |= std::memcmp(e.key(i).data(), keys.data() + k * KVT_DEFAULT_KEY_BYTES,
                                         KVT_DEFAULT_KEY_BYTES) == 0;
                }
                CHECK(known);
            }
        } else {
            CHECK(e.job_id == 1 && e.keys == keys);
            stored += e.num_keys();
        }
    }
    CHECK(stored == 4);
    CHECK(removed == 2);
    CHECK(tier.take_kv_events().empty());
    // Within budget now: a second round deletes nothing.
    const kvtier::EvictionReport again = tier.evict_now();
    CHECK(again.objects == 2 && again.deleted == 0);

    // Pinned blocks stay through a round over budget; unpinned, they go.
    CHECK(tier.pin(keys) == std::vector<bool>(4, true));
    store_and_wait(tier, 2, {0, 1, 2, 3}, keys);
    const kvtier::EvictionReport pinned = tier.evict_now();
    CHECK(pinned.objects == 4 && pinned.deleted == 0);
    tier.unpin(keys);
    const kvtier::EvictionReport unpinned = tier.evict_now();
    CHECK(unpinned.objects == 4 && unpinned.deleted == 2);
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.pin(keys, 7); }, "pin with a key length that splits the buffer",
                 false);

    // No eviction configured: STATE.
    kvtier::Tier plain(api, R"({"store":{"type":"memory"}})");
    expect_error(KVT_STATUS_STATE, [&] { plain.evict_now(); }, "evict_now without eviction");
}

// Regions and range jobs: an object stored from two ranges loads into a pool block and
// into other ranges with the same bytes.
void test_ranges(const kvtier::Api &api)
{
    constexpr std::size_t kBlockBytes = 4096;
    TempDir dir;
    std::mt19937_64 rng(17);
    std::vector<std::uint8_t> src(2 * kBlockBytes), dst(2 * kBlockBytes, 0), pool(2 * kBlockBytes, 0);
    for (auto &b : src) {
        b = static_cast<std::uint8_t>(rng());
    }
    const auto keys = make_keys(rng, 1);
    kvtier::Tier tier(api, local_config(dir));
    tier.register_memory(pool.data(), 2, kBlockBytes);
    const std::uint64_t a = tier.add_region(src.data(), src.size());
    const std::uint64_t b = tier.add_region(dst.data(), dst.size());
    CHECK(a != 0 && b != 0 && a != b);
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.add_region(src.data(), 0); }, "add_region of 0 bytes");

    // Key 0 = src[100..1100) followed by src[5000..8096): 4096 bytes.
    const kvtier::Range store_ranges[] = {{a, 100, 1000}, {a, 5000, kBlockBytes - 1000}};
    tier.submit_store_ranges(1, store_ranges, 2, keys);
    auto r = wait_results(tier, 1);
    CHECK(r.size() == 1 && r[0].ok() && r[0].bytes == kBlockBytes);
    std::vector<std::uint8_t> object(src.begin() + 100, src.begin() + 1100);
    object.insert(object.end(), src.begin() + 5000, src.begin() + 5000 + (kBlockBytes - 1000));

    // Load into pool block 1, and into dst as three ranges (reversed halves).
    const std::uint64_t block1[] = {1};
    tier.submit_load(2, block1, keys);
    const kvtier::Range load_ranges[] = {{b, kBlockBytes, 2048}, {b, 0, 1024}, {b, 6144, 1024}};
    tier.submit_load_ranges(3, load_ranges, 3, keys);
    r = wait_results(tier, 2);
    CHECK(r.size() == 2);
    for (const auto &x : r) {
        CHECK(x.ok());
    }
    CHECK(std::memcmp(pool.data() + kBlockBytes, object.data(), kBlockBytes) == 0);
    CHECK(std::memcmp(dst.data() + kBlockBytes, object.data(), 2048) == 0);
    CHECK(std::memcmp(dst.data(), object.data() + 2048, 1024) == 0);
    CHECK(std::memcmp(dst.data() + 6144, object.data() + 3072, 1024) == 0);

    // A load whose ranges do not add up to the object's length fails alone.
    const kvtier::Range short_range[] = {{b, 0, 100}};
    tier.submit_load_ranges(4, short_range, 1, keys);
    r = wait_results(tier, 1);
    CHECK(r.size() == 1 && r[0].job_id == 4 && !r[0].ok());
    // Unknown region: the library refuses, with the job's one result.
    const kvtier::Range unknown[] = {{b + 100, 0, kBlockBytes}};
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.submit_load_ranges(5, unknown, 1, keys); },
                 "range of an unknown region");
    r = wait_results(tier, 1);
    CHECK(r.size() == 1 && r[0].job_id == 5 && r[0].status == KVT_STATUS_INVALID_ARGUMENT);
    // Wrapper-side: two ranges for one key with ranges_per_key 1; nothing submitted.
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.submit_store_ranges(6, store_ranges, 1, keys); },
                 "ranges count mismatch", false);
    CHECK(tier.try_submit_store_ranges(6, store_ranges, 0, keys) == KVT_STATUS_INVALID_ARGUMENT);
    CHECK(tier.try_submit_load_ranges(7, load_ranges, 3, keys) == KVT_STATUS_OK);
    r = wait_results(tier, 1);
    CHECK(r.size() == 1 && r[0].job_id == 7 && r[0].ok());
    CHECK(tier.poll().empty()); // job 6 produced no result

    tier.remove_region(a);
    expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { tier.remove_region(a); }, "remove_region twice");
    tier.shutdown();
    expect_error(KVT_STATUS_SHUT_DOWN, [&] { tier.add_region(src.data(), src.size()); }, "add_region after shutdown");
    tier.remove_region(b); // works after shutdown
}

// config_check, config_schema, stats_fields, vllm_namespace, status_str: no tier needed.
void test_tierless(const kvtier::Api &api)
{
    kvtier::config_check(api, R"({"store":{"type":"memory"}})");
    std::string m = expect_error(
        KVT_STATUS_CONFIG,
        [&] { kvtier::config_check(api, R"({"store":{"type":"s3","bucket":"b","request_timeout_ms":"x"}})"); },
        "config_check of a bad value");
    CHECK(m.find("store.request_timeout_ms") != std::string::npos);
    CHECK(m.find("kvt_config_check") != std::string::npos);
    m = expect_error(KVT_STATUS_CONFIG, [&] { kvtier::config_check(api, R"({"store":{"type":"memory"},"colour":1})"); },
                     "config_check of an unknown key");
    CHECK(m.find("colour") != std::string::npos);
    expect_error(KVT_STATUS_CONFIG, [&] { kvtier::config_check(api, "{"); }, "config_check of malformed JSON");

    const std::string schema = kvtier::config_schema(api);
    CHECK(schema.front() == '{');
    CHECK(schema.find("\"store.request_timeout_ms\"") != std::string::npos);
    CHECK(schema.find("\"keys\"") != std::string::npos);
    const std::string fields = kvtier::stats_fields(api);
    CHECK(fields.front() == '[');
    CHECK(fields.find("\"name\": \"keys_stored\"") != std::string::npos ||
          fields.find("\"name\":\"keys_stored\"") != std::string::npos);
    CHECK(fields.find("damaged_uploads") != std::string::npos);

    const std::string ns =
        kvtier::vllm_namespace(api, R"({"model_name":"org/model-1","tokens_per_hash":16,"tp_size":2})", 3);
    CHECK(!ns.empty());
    CHECK(ns.rfind("org_model-1_", 0) == 0);
    CHECK(ns.size() == 12 + 12 + 3 && ns.compare(ns.size() - 3, 3, "_r3") == 0);
    CHECK(ns.find_first_not_of("0123456789abcdef", 12) == 24);
    // A long model name needs more than the wrapper's first buffer.
    const std::string long_name(300, 'm');
    const std::string ns_long = kvtier::vllm_namespace(api, R"({"model_name":")" + long_name + R"("})", 0);
    CHECK(ns_long.size() == 300 + 1 + 12 + 3 && ns_long.rfind(long_name, 0) == 0);
    m = expect_error(KVT_STATUS_INVALID_ARGUMENT, [&] { kvtier::vllm_namespace(api, R"({"tp_size":1})", 0); },
                     "vllm_namespace without model_name");
    CHECK(m.find("model_name") != std::string::npos);
    CHECK(kvtier::status_str(api, KVT_STATUS_CONFIG) == api.status_str(KVT_STATUS_CONFIG));
}

struct LogSeen {
    int calls = 0, ready = 0, above_max = 0;
};

void raw_log(void *userdata, kvt_log_level level, const char *target, const char *message)
{
    auto *seen = static_cast<LogSeen *>(userdata);
    ++seen->calls;
    seen->above_max += level > KVT_LOG_LEVEL_INFO;
    seen->ready += std::strncmp(target, "kvtier", 6) == 0 && std::strstr(message, "tier ready") != nullptr;
}

// The raw callback and the owning LogCallback; after reset neither is called again.
void test_log_callback(const kvtier::Api &api)
{
    LogSeen raw;
    kvtier::set_log_callback(api, &raw_log, &raw, KVT_LOG_LEVEL_INFO);
    { kvtier::Tier t(api, R"({"store":{"type":"memory"}})"); }
    kvtier::set_log_callback(api, nullptr, nullptr, KVT_LOG_LEVEL_OFF);
    CHECK(raw.ready == 1);
    CHECK(raw.above_max == 0);
    const int raw_calls = raw.calls;

    int ready = 0, calls = 0;
    {
        kvtier::LogCallback cb(
            api,
            [&](kvt_log_level, const char *target, const char *message) {
                ++calls;
                ready += std::strncmp(target, "kvtier", 6) == 0 && std::strstr(message, "tier ready") != nullptr;
                throw std::runtime_error("swallowed by the trampoline");
            },
            KVT_LOG_LEVEL_INFO);
        kvtier::Tier t(api, R"({"store":{"type":"memory"}})");
    }
    CHECK(ready == 1);
    const int after = calls;
    { kvtier::Tier t(api, R"({"store":{"type":"memory"}})"); } // default restored: nobody counts
    CHECK(calls == after);
    CHECK(raw.calls == raw_calls);
    expect_error(KVT_STATUS_INVALID_ARGUMENT,
                 [&] { kvtier::set_log_callback(api, &raw_log, &raw, static_cast<kvt_log_level>(6)); },
                 "log level out of range");
}

#ifndef KVTIER_HPP_TEST_LINKED
void test_dlclose_leaves_library(const kvtier::Api &api, const char *path)
{
    // The library is linked -z nodelete: closing our handle must leave it mapped.
    CHECK(::dlclose(api.handle) == 0);
    void *again = ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    CHECK(again != nullptr);
    if (again != nullptr) {
        CHECK(std::strcmp(api.version(), KVTIER_VERSION) == 0);
        ::dlclose(again);
    }
}
#endif

} // namespace

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
#ifdef KVTIER_HPP_TEST_LINKED
    const char *path = "(linked)";
    std::printf("kvtier.hpp test, linked mode (kvtier::Api::linked)\n");
#else
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s /path/to/libkvtier.so\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    std::printf("kvtier.hpp test, dlopen mode: %s\n", path);
#endif
    (void)argc;
    (void)argv;
    auto run = [&](const char *name, const std::function<void()> &body) {
        const int before = g_failed_checks;
        std::printf("[ RUN      ] %s\n", name);
        try {
            body();
        } catch (const std::exception &e) {
            std::printf("    FAIL uncaught exception: %s\n", e.what());
            ++g_failed_checks;
        }
        if (g_failed_checks == before) {
            ++passed;
            std::printf("[       OK ] %s\n", name);
        } else {
            ++failed;
            std::printf("[  FAILED  ] %s\n", name);
        }
    };

    kvtier::Api api;
    run("api_load", [&] {
#ifdef KVTIER_HPP_TEST_LINKED
        api = kvtier::Api::linked();
#else
        api = kvtier::Api::load(path);
#endif
        CHECK(api.complete());
    });
    if (api.complete()) {
#ifdef KVTIER_HPP_TEST_LINKED
        const kvtier::Api &a = kvtier::Api::linked();
#else
        const kvtier::Api &a = api;
#endif
        run("loader_errors", [&] { test_loader_errors(path); });
        run("version", [&] { test_version(a); });
        run("config_error", [&] { test_config_error(a); });
        run("round_trip", [&] { test_round_trip(a); });
        run("errors_and_results", [&] { test_errors_and_results(a); });
        run("lookups_events_stats", [&] { test_lookups_events_stats(a); });
        run("eviction", [&] { test_eviction(a); });
        run("ranges", [&] { test_ranges(a); });
        run("tierless", [&] { test_tierless(a); });
        run("log_callback", [&] { test_log_callback(a); });
#ifndef KVTIER_HPP_TEST_LINKED
        run("dlclose_leaves_library", [&] { test_dlclose_leaves_library(a, path); });
#endif
    } else {
        ++failed;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
