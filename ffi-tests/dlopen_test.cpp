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
#ifndef KVTIER_HPP_TEST_LINKED
        run("dlclose_leaves_library", [&] { test_dlclose_leaves_library(a, path); });
#endif
    } else {
        ++failed;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
